//! When to retry: retriable statuses and broken connections, with exponential backoff and
//! jitter, bounded by a count and a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};
use crate::frames::random_u64;

#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    retries_max: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    deadline: Duration,
}

impl RetryPolicy {
    pub(crate) fn new(config: &ClientConfig) -> RetryPolicy {
        RetryPolicy {
            retries_max: config.retries_max,
            backoff_initial: config.backoff_initial,
            backoff_max: config.backoff_max,
            deadline: config.retry_deadline,
        }
    }

    /// A policy that never retries, for calls whose own timeout is the caller's (FLUSH).
    pub(crate) fn never() -> RetryPolicy {
        RetryPolicy {
            retries_max: 0,
            backoff_initial: Duration::ZERO,
            backoff_max: Duration::ZERO,
            deadline: Duration::ZERO,
        }
    }

    /// The wait before retry number `retry` (0 for the first) after `error`, or `None` when the
    /// error is not retriable, the retries are spent, or the wait would end past the deadline.
    pub(crate) fn wait_before(
        &self,
        retry: u32,
        started: Instant,
        error: &ClientError,
    ) -> Option<Duration> {
        if !error.is_retriable() || retry >= self.retries_max {
            return None;
        }
        let wait = backoff(self.backoff_initial, self.backoff_max, retry, random_u64());
        (started.elapsed() + wait <= self.deadline).then_some(wait)
    }
}

/// Exponential backoff with "equal jitter": the ceiling doubles per retry up to `maximum`, and
/// the wait is drawn between half of it and all of it (`random` picks where).
pub(crate) fn backoff(initial: Duration, maximum: Duration, retry: u32, random: u64) -> Duration {
    let ceiling = initial
        .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
        .min(maximum);
    let half = ceiling / 2;
    let spread_nanos = (ceiling - half).as_nanos() as u64;
    half + Duration::from_nanos(random % spread_nanos.max(1))
}

/// Run `attempt` until it succeeds or `policy` says to stop, sleeping between attempts; returns
/// the last error. `retries` counts the retries made, for the client's statistics.
pub(crate) fn retrying<T>(
    policy: &RetryPolicy,
    retries: &AtomicU64,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut retry = 0;
    loop {
        let error = match attempt() {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let Some(wait) = policy.wait_before(retry, started, &error) else {
            return Err(error);
        };
        std::thread::sleep(wait);
        retry += 1;
        retries.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_jitters_within_half() {
        let initial = Duration::from_millis(10);
        let maximum = Duration::from_millis(100);
        for retry in 0..10 {
            let ceiling = (initial * 2u32.pow(retry)).min(maximum);
            for random in [0, 1, 12_345, u64::MAX] {
                let wait = backoff(initial, maximum, retry, random);
                assert!(wait >= ceiling / 2 && wait <= ceiling, "{retry}: {wait:?}");
            }
        }
        assert_eq!(backoff(initial, maximum, 100, 0), maximum / 2);
    }

    #[test]
    fn retries_stop_at_the_count_and_skip_errors_that_are_not_retriable() {
        let config = ClientConfig::new(&[])
            .retries_max(3)
            .backoff(Duration::from_millis(1), Duration::from_millis(2));
        let policy = RetryPolicy::new(&config);
        let retries = AtomicU64::new(0);
        let mut attempts = 0;
        let busy = |attempt: u32| ClientError::Status {
            status: hydrant_proto::Status::Busy as u8,
            message: format!("attempt {attempt}"),
        };
        let error = retrying(&policy, &retries, || -> Result<()> {
            attempts += 1;
            Err(busy(attempts))
        })
        .unwrap_err();
        assert_eq!(attempts, 4, "the first attempt and three retries");
        assert_eq!(retries.load(Ordering::Relaxed), 3);
        assert!(
            error.to_string().ends_with("attempt 4"),
            "the last error: {error}"
        );
        let mut attempts = 0;
        let error = retrying(&policy, &retries, || -> Result<()> {
            attempts += 1;
            Err(ClientError::Usage("bad".into()))
        })
        .unwrap_err();
        assert_eq!(attempts, 1);
        assert!(matches!(error, ClientError::Usage(_)));
    }

    #[test]
    fn no_retry_starts_after_the_deadline() {
        let config = ClientConfig::new(&[])
            .retries_max(1000)
            .backoff(Duration::from_millis(20), Duration::from_millis(20))
            .retry_deadline(Duration::from_millis(100));
        let policy = RetryPolicy::new(&config);
        let started = Instant::now();
        let mut attempts = 0;
        let _ = retrying(&policy, &AtomicU64::new(0), || -> Result<()> {
            attempts += 1;
            Err(ClientError::Io(std::io::ErrorKind::ConnectionReset.into()))
        });
        assert!(started.elapsed() < Duration::from_millis(200));
        assert!((5..=11).contains(&attempts), "{attempts} attempts");
    }
}
