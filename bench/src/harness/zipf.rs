//! Seeded random numbers and the key choosers of the workloads: uniform, and Zipf's law by
//! `rand_distr`'s rejection-inversion sampler (Hörmann and Derflinger, 1996), which draws a rank
//! in O(1) time and memory for any key count and any exponent above 0, including exactly 1.

use rand::{RngExt, SeedableRng};
use rand_distr::Distribution;

/// A thread's generator: `rand`'s xoshiro256++ (a named algorithm, so a seed draws the same
/// keys in every version; not for cryptography). Every thread seeds its own from the run's seed
/// and its thread number, so runs repeat.
#[derive(Clone, Debug)]
pub struct Random(rand::rngs::Xoshiro256PlusPlus);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(rand::rngs::Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.random()
    }

    /// A uniform value in [0, 1).
    pub fn next_unit(&mut self) -> f64 {
        self.0.random()
    }

    /// A uniform value in [0, bound).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        self.0.random_range(0..bound)
    }
}

/// Zipf's law over ranks 1..=n: P(k) is proportional to 1 / k^exponent.
#[derive(Clone, Debug)]
pub struct Zipf(rand_distr::Zipf<f64>);

impl Zipf {
    pub fn new(n: u64, exponent: f64) -> Zipf {
        assert!(n >= 1, "Zipf needs at least one rank");
        assert!(
            exponent > 0.0 && exponent.is_finite(),
            "the Zipf exponent must be above 0"
        );
        Zipf(rand_distr::Zipf::new(n as f64, exponent).expect("n and the exponent were checked"))
    }

    /// A rank in 1..=n.
    pub fn sample(&self, random: &mut Random) -> u64 {
        self.0.sample(&mut random.0) as u64
    }
}

/// How a workload picks the next key out of `keys`.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    Uniform {
        keys: u64,
    },
    /// Rank 1 is key 0. Hot keys are therefore the first ones loaded; with one server that does
    /// not matter, and across servers placement hashes the key's name, not its index.
    Zipf(Zipf),
}

impl KeyChooser {
    pub fn uniform(keys: u64) -> KeyChooser {
        assert!(keys >= 1);
        KeyChooser::Uniform { keys }
    }

    pub fn zipf(keys: u64, exponent: f64) -> KeyChooser {
        KeyChooser::Zipf(Zipf::new(keys, exponent))
    }

    /// A key index in 0..keys.
    pub fn next(&self, random: &mut Random) -> u64 {
        match self {
            KeyChooser::Uniform { keys } => random.below(*keys),
            KeyChooser::Zipf(zipf) => zipf.sample(random) - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANKS: u64 = 1_000;
    const SAMPLES: u64 = 1_000_000;

    /// Expected probability of each rank 1..=n.
    fn theory(n: u64, exponent: f64) -> Vec<f64> {
        let weights: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-exponent)).collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|weight| weight / total).collect()
    }

    fn histogram(n: u64, exponent: f64, seed: u64) -> Vec<u64> {
        let zipf = Zipf::new(n, exponent);
        let mut random = Random::new(seed);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..SAMPLES {
            let rank = zipf.sample(&mut random);
            assert!((1..=n).contains(&rank), "rank {rank} out of 1..={n}");
            counts[rank as usize - 1] += 1;
        }
        counts
    }

    /// Pearson's chi-square statistic of `counts` against `probabilities`, ranks whose expected
    /// count is under 5 pooled into one bin (the usual validity rule); returns (statistic,
    /// degrees of freedom).
    fn chi_square(counts: &[u64], probabilities: &[f64]) -> (f64, f64) {
        let total: u64 = counts.iter().sum();
        let (mut statistic, mut bins) = (0.0, 0usize);
        let (mut pooled_observed, mut pooled_expected) = (0.0, 0.0);
        for (&observed, &probability) in counts.iter().zip(probabilities) {
            let expected = probability * total as f64;
            if expected < 5.0 {
                pooled_observed += observed as f64;
                pooled_expected += expected;
            } else {
                statistic += (observed as f64 - expected).powi(2) / expected;
                bins += 1;
            }
        }
        if pooled_expected > 0.0 {
            statistic += (pooled_observed - pooled_expected).powi(2) / pooled_expected;
            bins += 1;
        }
        (statistic, (bins - 1) as f64)
    }

    /// The chi-square distribution's 99.9th percentile (Wilson and Hilferty's approximation,
    /// within a percent for these degrees of freedom).
    fn chi_square_critical(degrees: f64) -> f64 {
        const Z_999: f64 = 3.090;
        let term = 2.0 / (9.0 * degrees);
        degrees * (1.0 - term + Z_999 * term.sqrt()).powi(3)
    }

    fn assert_follows_zipf(exponent: f64) {
        let counts = histogram(RANKS, exponent, 42);
        let probabilities = theory(RANKS, exponent);
        let (statistic, degrees) = chi_square(&counts, &probabilities);
        let critical = chi_square_critical(degrees);
        assert!(
            statistic < critical,
            "alpha {exponent}: chi-square {statistic:.1} over {degrees} degrees of freedom exceeds {critical:.1}"
        );
        // Rank 1's frequency, the hottest key's share, within 2% of theory.
        let share = counts[0] as f64 / SAMPLES as f64;
        let relative_error = (share - probabilities[0]).abs() / probabilities[0];
        assert!(
            relative_error < 0.02,
            "alpha {exponent}: rank 1 drawn {share:.4}, theory {:.4}",
            probabilities[0]
        );
    }

    #[test]
    fn zipf_099_follows_the_law() {
        assert_follows_zipf(0.99);
    }

    #[test]
    fn zipf_12_follows_the_law() {
        assert_follows_zipf(1.2);
    }

    #[test]
    fn zipf_exactly_1_follows_the_law() {
        assert_follows_zipf(1.0);
    }

    #[test]
    fn the_test_tells_exponents_apart() {
        // Samples drawn at 1.2 must fail against 0.99's law, or the chi-square test above could
        // not catch a wrong exponent.
        let counts = histogram(RANKS, 1.2, 7);
        let (statistic, degrees) = chi_square(&counts, &theory(RANKS, 0.99));
        assert!(statistic > chi_square_critical(degrees) * 10.0);
    }

    #[test]
    fn one_rank_and_huge_ranges_stay_in_bounds() {
        let mut random = Random::new(1);
        let single = Zipf::new(1, 0.99);
        let huge = Zipf::new(10_000_000_000, 1.2);
        for _ in 0..10_000 {
            assert_eq!(single.sample(&mut random), 1);
            let rank = huge.sample(&mut random);
            assert!((1..=10_000_000_000).contains(&rank));
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_keys() {
        let chooser = KeyChooser::zipf(1_000, 0.99);
        let draw = |seed| {
            let mut random = Random::new(seed);
            (0..100)
                .map(|_| chooser.next(&mut random))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    #[test]
    fn uniform_keys_cover_the_range_evenly() {
        let chooser = KeyChooser::uniform(10);
        let mut random = Random::new(3);
        let mut counts = [0u64; 10];
        for _ in 0..100_000 {
            counts[chooser.next(&mut random) as usize] += 1;
        }
        let (statistic, degrees) = chi_square(&counts, &[0.1; 10]);
        assert!(statistic < chi_square_critical(degrees));
    }
}
