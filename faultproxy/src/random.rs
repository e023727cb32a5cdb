//! A small seeded generator (SplitMix64) for fault and delay draws, so that runs repeat without
//! a dependency on a random-number crate. Statistical quality is ample for drawing faults; it is
//! not for cryptography.

/// SplitMix64 (Steele, Lea and Flood, 2014): one 64-bit state, advanced by a constant and mixed.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator for stream `stream` of `seed`: each connection draws from its own stream, so
    /// that a connection's draws do not depend on how threads interleave.
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        let mut mixer = SplitMix64::new(seed ^ stream.wrapping_mul(Self::GOLDEN_GAMMA));
        SplitMix64::new(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GOLDEN_GAMMA);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// A number in `[0, 1)` with 53 random bits, the precision of an `f64`.
    pub fn next_unit(&mut self) -> f64 {
        const MANTISSA_BITS: u32 = 53;
        (self.next_u64() >> (64 - MANTISSA_BITS)) as f64 / (1u64 << MANTISSA_BITS) as f64
    }

    /// A number in `0..bound`. The modulo bias is below 2^-40 for the bounds used here (list
    /// lengths, milliseconds, body lengths), far below what a test could notice.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range has no member to draw");
        self.next_u64() % bound
    }

    /// A number in `min..=max`.
    pub fn between(&mut self, min: u64, max: u64) -> u64 {
        assert!(min <= max);
        match (max - min).checked_add(1) {
            Some(span) => min + self.below(span),
            None => self.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_repeats_and_streams_differ() {
        let first: Vec<u64> = {
            let mut random = SplitMix64::for_stream(7, 0);
            (0..8).map(|_| random.next_u64()).collect()
        };
        let again: Vec<u64> = {
            let mut random = SplitMix64::for_stream(7, 0);
            (0..8).map(|_| random.next_u64()).collect()
        };
        let other_stream: Vec<u64> = {
            let mut random = SplitMix64::for_stream(7, 1);
            (0..8).map(|_| random.next_u64()).collect()
        };
        assert_eq!(first, again);
        assert_ne!(first, other_stream);
    }

    #[test]
    fn the_reference_sequence_for_seed_zero() {
        // The first outputs of SplitMix64 seeded with 0, as published with the algorithm.
        let mut random = SplitMix64::new(0);
        assert_eq!(random.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(random.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn draws_stay_in_range_and_cover_it() {
        let mut random = SplitMix64::new(42);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let unit = random.next_unit();
            assert!((0.0..1.0).contains(&unit));
            let value = random.between(10, 14);
            assert!((10..=14).contains(&value));
            seen[(value - 10) as usize] = true;
        }
        assert!(seen.iter().all(|&hit| hit));
        assert_eq!(random.between(3, 3), 3);
    }
}
