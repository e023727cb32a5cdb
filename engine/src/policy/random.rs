//! A small, fast, deterministic random source and a 64-bit mixer, for the admission filter's
//! hashing and its coin flips. Not for anything that needs unpredictability against a reader of
//! the code: the seed is per instance so that runs are reproducible.

/// splitmix64's finaliser: spreads every input bit over the output, so that sequential keys
/// (trace ids 1, 2, 3, ...) land in unrelated sketch counters.
pub(crate) fn mix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

/// splitmix64 as a generator: one add and one mix per number.
pub(crate) struct Random {
    state: u64,
}

/// splitmix64's increment (the golden ratio in 64 bits).
const INCREMENT: u64 = 0x9e37_79b9_7f4a_7c15;

impl Random {
    pub(crate) fn new(seed: u64) -> Random {
        Random { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(INCREMENT);
        mix(self.state)
    }

    /// True with probability 1 / `denominator` (a power of two).
    pub(crate) fn one_in(&mut self, denominator: u64) -> bool {
        debug_assert!(denominator.is_power_of_two());
        self.next_u64() & (denominator - 1) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_eight_comes_up_about_an_eighth_of_the_time() {
        let mut random = Random::new(7);
        let trials = 80_000;
        let successes = (0..trials).filter(|_| random.one_in(8)).count();
        assert!(
            (9_000..11_000).contains(&successes),
            "{successes} of {trials}"
        );
    }

    #[test]
    fn mix_separates_neighbouring_keys() {
        let differing_bits = (mix(1) ^ mix(2)).count_ones();
        assert!(differing_bits > 16, "{differing_bits} bits differ");
    }
}
