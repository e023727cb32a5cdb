//! A token bucket shared by every connection, which caps the body bytes relayed in both
//! directions together, as one network link would.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How much unused bandwidth the bucket saves up: 100 ms worth. A small burst keeps the rate
/// smooth over short intervals while not starving a single copy of a read buffer's worth.
pub const BURST_MS: u64 = 100;

pub struct Throttle {
    bucket: Mutex<Bucket>,
}

struct Bucket {
    /// 0 is unlimited.
    rate_bytes_per_second: u64,
    /// Bytes that may be sent now; negative while senders wait for a debt to be paid off.
    tokens: f64,
    refilled_at: Instant,
}

impl Bucket {
    fn capacity(&self) -> f64 {
        self.rate_bytes_per_second as f64 * BURST_MS as f64 / 1000.0
    }
}

impl Throttle {
    pub fn new(rate_bytes_per_second: u64) -> Self {
        let throttle = Throttle {
            bucket: Mutex::new(Bucket {
                rate_bytes_per_second: 0,
                tokens: 0.0,
                refilled_at: Instant::now(),
            }),
        };
        throttle.set_rate(rate_bytes_per_second);
        throttle
    }

    /// Starts over at the new rate with a full burst, so that a change takes effect at once.
    pub fn set_rate(&self, rate_bytes_per_second: u64) {
        let mut bucket = self.bucket.lock().unwrap();
        bucket.rate_bytes_per_second = rate_bytes_per_second;
        bucket.tokens = bucket.capacity();
        bucket.refilled_at = Instant::now();
    }

    /// Takes `bytes` from the bucket, sleeping until the bucket's debt is paid off if it runs
    /// dry. Taking first and sleeping after (instead of waiting for enough tokens) keeps the
    /// lock out of the sleep and serves concurrent senders in the order they came.
    pub fn acquire(&self, bytes: u64) {
        let wait = {
            let mut bucket = self.bucket.lock().unwrap();
            if bucket.rate_bytes_per_second == 0 {
                return;
            }
            let now = Instant::now();
            let elapsed_seconds = now.duration_since(bucket.refilled_at).as_secs_f64();
            bucket.refilled_at = now;
            bucket.tokens = (bucket.tokens + elapsed_seconds * bucket.rate_bytes_per_second as f64)
                .min(bucket.capacity());
            bucket.tokens -= bytes as f64;
            if bucket.tokens >= 0.0 {
                return;
            }
            Duration::from_secs_f64(-bucket.tokens / bucket.rate_bytes_per_second as f64)
        };
        thread::sleep(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlimited_throttle_never_waits() {
        let throttle = Throttle::new(0);
        let started = Instant::now();
        for _ in 0..1000 {
            throttle.acquire(1 << 30);
        }
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_limited_throttle_paces_beyond_its_burst() {
        // 400 KiB at 1 MiB/s after a 100 ms burst needs at least 400 KiB / (1 MiB/s) - 0.1 s,
        // about 0.29 s.
        let rate = 1 << 20;
        let throttle = Throttle::new(rate);
        let started = Instant::now();
        for _ in 0..400 {
            throttle.acquire(1024);
        }
        let lower_bound_seconds = (400.0 * 1024.0) / rate as f64 - BURST_MS as f64 / 1000.0;
        assert!(started.elapsed().as_secs_f64() >= lower_bound_seconds * 0.95);
    }
}
