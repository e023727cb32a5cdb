//! The admission filter's memory of how often keys were seen: a count-min sketch of 4-bit counters
//! behind a doorkeeper Bloom filter, aged by halving (TinyLFU, Einziger et al., 2017).
//!
//! A key's first sighting in a period only sets its doorkeeper bits, so the many keys seen once
//! never touch the counters; later sightings add one to each of the key's four counters, which
//! saturate at 15. The estimate is the smallest of the four plus the doorkeeper's bit. After a
//! sample of `SAMPLE_SIZE_PER_OBJECT` times the expected population of additions, every counter
//! is halved and the doorkeeper cleared, so that the sketch follows a changing popularity.
//! Memory: 8 bytes of counters and 2 bytes of doorkeeper per expected object.

use super::random::mix;

/// A counter's ceiling (4 bits).
pub const COUNTER_MAX: u8 = 15;
/// Counters per key (the sketch's depth).
const DEPTH: usize = 4;
/// Additions in one aging period, per expected object (TinyLFU's W/C ratio).
pub const SAMPLE_SIZE_PER_OBJECT: u64 = 10;
/// Doorkeeper bits per expected object: a period can see several times the population in distinct
/// keys, and a false positive only costs a count.
const DOORKEEPER_BITS_PER_OBJECT: u64 = 16;
/// Bits the doorkeeper sets per key.
const DOORKEEPER_PROBES: u32 = 2;
/// The smallest population sized for. A tiny cache still sees many distinct keys: with fewer
/// counters they collide, and with a shorter period the counts never rise above noise (a
/// 10-object cache on a Zipf trace of 1,000 keys lost 3 points of hit ratio at 16).
const EXPECTED_OBJECTS_MIN: u64 = 64;
/// Each 64-bit word holds 16 counters of 4 bits.
const COUNTERS_PER_WORD: u64 = 16;
/// A key's counters share one block of this many words: 64 bytes, one cache line.
const WORDS_PER_BLOCK: u64 = 8;
/// Clears the high bit of every 4-bit counter after a shift right: halving all 16 at once.
const HALVE_MASK: u64 = 0x7777_7777_7777_7777;

/// Count-min sketch with doorkeeper.
pub struct FrequencySketch {
    counters: Vec<u64>,
    doorkeeper: Vec<u64>,
    expected_objects: u64,
    sample_size: u64,
    additions: u64,
    seed: u64,
}

impl FrequencySketch {
    /// A sketch for about `expected_objects` distinct hot keys, hashing with `seed`.
    pub fn new(expected_objects: u64, seed: u64) -> FrequencySketch {
        let mut sketch = FrequencySketch {
            counters: Vec::new(),
            doorkeeper: Vec::new(),
            expected_objects: 0,
            sample_size: 0,
            additions: 0,
            seed,
        };
        sketch.resize(expected_objects.max(EXPECTED_OBJECTS_MIN));
        sketch
    }

    /// Grows the sketch for a larger population (a byte-sized cache learns its population as it
    /// fills). Growing forgets all counts, so it goes in doublings: a logarithmic number of times.
    pub fn ensure_capacity(&mut self, expected_objects: u64) {
        if expected_objects > self.expected_objects {
            self.resize(expected_objects.max(self.expected_objects * 2));
        }
    }

    fn resize(&mut self, expected_objects: u64) {
        self.expected_objects = expected_objects;
        self.sample_size = expected_objects.saturating_mul(SAMPLE_SIZE_PER_OBJECT);
        // One word of 16 counters per expected object: four counters per key, four times over.
        let words = expected_objects.next_power_of_two().max(WORDS_PER_BLOCK);
        let doorkeeper_words = (expected_objects * DOORKEEPER_BITS_PER_OBJECT / 64)
            .max(1)
            .next_power_of_two();
        // Both lengths are powers of two, so that `positions` and `doorkeeper_bits` can mask.
        assert!(words.is_power_of_two() && doorkeeper_words.is_power_of_two());
        self.counters = vec![0; words as usize];
        self.doorkeeper = vec![0; doorkeeper_words as usize];
        self.additions = 0;
    }

    /// Additions before the next halving.
    pub fn sample_size(&self) -> u64 {
        self.sample_size
    }

    pub fn expected_objects(&self) -> u64 {
        self.expected_objects
    }

    /// Notes one sighting of `key`.
    pub fn increment(&mut self, key: u64) {
        let hash = mix(key ^ self.seed);
        if self.doorkeeper_insert(hash) {
            for (word, shift) in self.positions(hash) {
                let counter = (self.counters[word] >> shift) & u64::from(COUNTER_MAX);
                if counter < u64::from(COUNTER_MAX) {
                    self.counters[word] += 1 << shift;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.sample_size {
            self.age();
        }
    }

    /// The estimated sightings of `key` in the current period (0 to 16).
    pub fn frequency(&self, key: u64) -> u8 {
        let hash = mix(key ^ self.seed);
        let seen = u8::from(self.doorkeeper_contains(hash));
        self.counter_estimate_of(hash) + seen
    }

    /// The counters' part of the estimate, without the doorkeeper (0 to 15).
    pub fn counter_estimate(&self, key: u64) -> u8 {
        self.counter_estimate_of(mix(key ^ self.seed))
    }

    fn counter_estimate_of(&self, hash: u64) -> u8 {
        self.positions(hash)
            .map(|(word, shift)| ((self.counters[word] >> shift) & u64::from(COUNTER_MAX)) as u8)
            .min()
            .expect("DEPTH > 0")
    }

    /// Halves every counter and clears the doorkeeper: the end of an aging period.
    pub fn age(&mut self) {
        for word in &mut self.counters {
            *word = (*word >> 1) & HALVE_MASK;
        }
        self.doorkeeper.fill(0);
        self.additions /= 2;
    }

    /// The word and bit offset of each of a key's counters. All four lie in one block of eight
    /// words (one 64-byte cache line), each depth in its own pair of words, so that an update
    /// costs one cache miss instead of four.
    fn positions(&self, hash: u64) -> impl Iterator<Item = (usize, u32)> {
        let blocks = self.counters.len() as u64 / WORDS_PER_BLOCK;
        // A power of two (see `resize`): a mask instead of a division, which on the hit path
        // cost as much as the rest of the arithmetic together.
        let block = (hash & (blocks - 1)) * WORDS_PER_BLOCK;
        let selectors = mix(hash);
        (0..DEPTH as u64).map(move |depth| {
            let bits = selectors >> (depth * 8);
            let word = block + depth * 2 + (bits & 1);
            let counter = (bits >> 1) & (COUNTERS_PER_WORD - 1);
            (word as usize, (counter * 4) as u32)
        })
    }

    /// The doorkeeper's word for a key and the bits it sets there: one cache line per key.
    fn doorkeeper_bits(&self, hash: u64) -> (usize, u64) {
        let word = hash.rotate_left(32) & (self.doorkeeper.len() as u64 - 1);
        let selectors = hash.rotate_left(17);
        let mut bits = 0u64;
        for probe in 0..DOORKEEPER_PROBES {
            bits |= 1u64 << ((selectors >> (probe * 6)) & 63);
        }
        (word as usize, bits)
    }

    fn doorkeeper_contains(&self, hash: u64) -> bool {
        let (word, bits) = self.doorkeeper_bits(hash);
        self.doorkeeper[word] & bits == bits
    }

    /// Sets the key's doorkeeper bits; returns whether they were all set already.
    fn doorkeeper_insert(&mut self, hash: u64) -> bool {
        let (word, bits) = self.doorkeeper_bits(hash);
        let present = self.doorkeeper[word] & bits == bits;
        self.doorkeeper[word] |= bits;
        present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_saturate_at_fifteen() {
        let mut sketch = FrequencySketch::new(1 << 16, 1);
        for _ in 0..100 {
            sketch.increment(42);
        }
        assert_eq!(sketch.counter_estimate(42), COUNTER_MAX);
        // The doorkeeper's bit adds one.
        assert_eq!(sketch.frequency(42), COUNTER_MAX + 1);
    }

    #[test]
    fn first_sighting_only_reaches_the_doorkeeper() {
        let mut sketch = FrequencySketch::new(1 << 16, 1);
        assert_eq!(sketch.frequency(7), 0);
        sketch.increment(7);
        assert_eq!(sketch.counter_estimate(7), 0);
        assert_eq!(sketch.frequency(7), 1);
        sketch.increment(7);
        assert_eq!(sketch.counter_estimate(7), 1);
        assert_eq!(sketch.frequency(7), 2);
    }

    #[test]
    fn aging_halves_counters_and_clears_the_doorkeeper() {
        let mut sketch = FrequencySketch::new(1 << 16, 1);
        for _ in 0..11 {
            sketch.increment(5);
        }
        assert_eq!(sketch.counter_estimate(5), 10);
        sketch.age();
        assert_eq!(sketch.counter_estimate(5), 5);
        assert_eq!(sketch.frequency(5), 5);
        sketch.age();
        assert_eq!(sketch.counter_estimate(5), 2);
    }

    #[test]
    fn sample_size_of_additions_triggers_aging() {
        let expected = 64;
        let mut sketch = FrequencySketch::new(expected, 3);
        assert_eq!(sketch.sample_size(), expected * SAMPLE_SIZE_PER_OBJECT);
        for _ in 0..16 {
            sketch.increment(9);
        }
        assert_eq!(sketch.counter_estimate(9), COUNTER_MAX);
        // Fill the period up to one short of its end; the counters are saturated, so collisions
        // cannot move them.
        for key in 1000..1000 + sketch.sample_size() - 17 {
            sketch.increment(key);
        }
        assert_eq!(sketch.counter_estimate(9), COUNTER_MAX);
        sketch.increment(1);
        assert_eq!(sketch.counter_estimate(9), COUNTER_MAX / 2);
    }

    #[test]
    fn growing_by_one_object_does_not_forget_every_time() {
        let mut sketch = FrequencySketch::new(64, 1);
        sketch.ensure_capacity(65);
        assert_eq!(sketch.expected_objects(), 128);
        for _ in 0..4 {
            sketch.increment(3);
        }
        for population in 66..=128 {
            sketch.ensure_capacity(population);
        }
        assert_eq!(sketch.counter_estimate(3), 3);
        assert_eq!(sketch.sample_size(), 128 * SAMPLE_SIZE_PER_OBJECT);
    }

    #[test]
    fn estimates_separate_hot_from_cold_keys() {
        let mut sketch = FrequencySketch::new(1024, 11);
        for round in 0..8 {
            for key in 0..100 {
                sketch.increment(key);
            }
            sketch.increment(100_000 + round);
        }
        let hot: u32 = (0..100).map(|key| u32::from(sketch.frequency(key))).sum();
        let cold: u32 = (0..8)
            .map(|round| u32::from(sketch.frequency(100_000 + round)))
            .sum();
        assert!(hot >= 100 * 8, "hot keys estimated at {hot}");
        assert!(cold <= 8 * 2, "cold keys estimated at {cold}");
    }
}
