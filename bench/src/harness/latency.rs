//! Latency histograms: one HdrHistogram per thread (recording never contends), merged once at the
//! end, summarised as the percentiles the tables and the JSON report.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The slowest operation a histogram can hold; slower ones are recorded as this (saturated), and
/// a request that slow has timed out in the client long before.
const LATENCY_NANOSECONDS_MAX: u64 = 600 * 1_000_000_000;
/// Three significant digits: a recorded value is within 0.1% of the true one.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A histogram of operation latencies in nanoseconds.
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies::new()
    }
}

impl Latencies {
    pub fn new() -> Latencies {
        Latencies {
            histogram: Histogram::new_with_bounds(1, LATENCY_NANOSECONDS_MAX, SIGNIFICANT_DIGITS)
                .expect("the bounds are valid"),
        }
    }

    pub fn record(&mut self, latency: Duration) {
        let nanoseconds = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanoseconds.max(1));
    }

    pub fn merge(&mut self, other: &Latencies) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms of the same bounds always merge");
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn summary(&self) -> LatencySummary {
        let microseconds = |nanoseconds: u64| nanoseconds as f64 / 1_000.0;
        if self.histogram.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            p50: microseconds(self.histogram.value_at_quantile(0.50)),
            p90: microseconds(self.histogram.value_at_quantile(0.90)),
            p99: microseconds(self.histogram.value_at_quantile(0.99)),
            p99_9: microseconds(self.histogram.value_at_quantile(0.999)),
            max: microseconds(self.histogram.max()),
            mean: self.histogram.mean() / 1_000.0,
        }
    }
}

/// Latency percentiles in microseconds (all 0 when nothing was measured).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

impl LatencySummary {
    /// Names and values in the order tables and plots show them.
    pub fn percentiles(&self) -> [(&'static str, f64); 5] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p99_9),
            ("max", self.max),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::zipf::Random;

    /// Latencies spread over four orders of magnitude, like a cache's hits and misses.
    fn sample_latencies(count: usize, seed: u64) -> Vec<Duration> {
        let mut random = Random::new(seed);
        (0..count)
            .map(|_| {
                let exponent = random.next_unit() * 4.0;
                Duration::from_nanos((10_000.0 * 10f64.powf(exponent)) as u64)
            })
            .collect()
    }

    #[test]
    fn merged_histograms_equal_one_fed_everything() {
        let threads: Vec<Vec<Duration>> =
            (0..8).map(|seed| sample_latencies(10_000, seed)).collect();
        let mut single = Latencies::new();
        let mut merged = Latencies::new();
        for values in &threads {
            let mut per_thread = Latencies::new();
            for &value in values {
                single.record(value);
                per_thread.record(value);
            }
            merged.merge(&per_thread);
        }
        assert_eq!(merged.count(), 80_000);
        assert_eq!(merged.summary(), single.summary());
    }

    #[test]
    fn percentiles_are_within_the_histograms_precision() {
        let mut values = sample_latencies(50_000, 99);
        let mut latencies = Latencies::new();
        for &value in &values {
            latencies.record(value);
        }
        values.sort();
        let summary = latencies.summary();
        let exact = |quantile: f64| {
            let index = ((quantile * values.len() as f64).ceil() as usize).max(1) - 1;
            values[index].as_nanos() as f64 / 1_000.0
        };
        for (quantile, measured) in [
            (0.50, summary.p50),
            (0.90, summary.p90),
            (0.99, summary.p99),
            (0.999, summary.p99_9),
            (1.0, summary.max),
        ] {
            let relative_error = (measured - exact(quantile)).abs() / exact(quantile);
            assert!(
                relative_error < 0.002,
                "quantile {quantile}: histogram {measured} us, exact {} us",
                exact(quantile)
            );
        }
    }

    #[test]
    fn an_empty_histogram_summarises_to_zeros() {
        assert_eq!(Latencies::new().summary(), LatencySummary::default());
    }
}
