//! Running a workload: one thread per connection, each recording its operations' latencies in its
//! own histograms, bounded by a duration and/or an operation count, reporting progress once a
//! second on stderr and stopping cleanly on Ctrl-C.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hydrant_client::ClientError;

use super::interrupt;
use super::latency::Latencies;
use super::schema::ThroughputSample;

/// Progress and throughput samples are taken this often.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the main thread looks for the end of the run between samples.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// A last partial interval shorter than this is left out of the samples: its rate is noise.
const SAMPLE_INTERVAL_MIN: Duration = Duration::from_millis(100);
const BYTES_PER_MEBIBYTE: f64 = 1_048_576.0;

/// When a run ends: after `duration`, after `operations` operations in all, whichever comes
/// first, or when every thread has run out of work.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    pub duration: Option<Duration>,
    pub operations: Option<u64>,
}

/// What every thread of a run shares: the counters the progress line reads and the stop flag.
struct Shared {
    stop: AtomicBool,
    claimed: AtomicU64,
    operations: AtomicU64,
    bytes: AtomicU64,
    finished_threads: AtomicUsize,
    operations_max: u64,
}

/// A thread's handle on the run: it asks for the next operation and records what each did.
pub struct ThreadContext<'run> {
    shared: &'run Shared,
    kinds: Vec<KindTotals>,
    errors: u64,
}

/// Operations of one kind (get, put) on one thread, or merged.
pub struct KindTotals {
    pub operations: u64,
    pub bytes: u64,
    pub latencies: Latencies,
}

impl KindTotals {
    fn new() -> KindTotals {
        KindTotals {
            operations: 0,
            bytes: 0,
            latencies: Latencies::new(),
        }
    }
}

impl ThreadContext<'_> {
    /// The run-wide number of the next operation, or `None` when the run is over (stopped,
    /// interrupted, or every operation allowed has been handed out).
    pub fn next(&mut self) -> Option<u64> {
        if self.should_stop() {
            return None;
        }
        let number = self.shared.claimed.fetch_add(1, Ordering::Relaxed);
        (number < self.shared.operations_max).then_some(number)
    }

    pub fn should_stop(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed) || interrupt::interrupted()
    }

    /// Time `operation` and record it as `kind`; it returns the bytes it moved, and so does
    /// this. A retriable error (the server is busy) is counted and gives `None`; any other ends
    /// the thread.
    pub fn measure(
        &mut self,
        kind: usize,
        operation: impl FnOnce() -> Result<u64, ClientError>,
    ) -> Result<Option<u64>, ClientError> {
        let started = Instant::now();
        match operation() {
            Ok(bytes) => {
                self.record(kind, started.elapsed(), bytes);
                Ok(Some(bytes))
            }
            Err(error) if error.is_retriable() => {
                self.errors += 1;
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    pub fn record(&mut self, kind: usize, latency: Duration, bytes: u64) {
        let totals = &mut self.kinds[kind];
        totals.operations += 1;
        totals.bytes += bytes;
        totals.latencies.record(latency);
        self.shared.operations.fetch_add(1, Ordering::Relaxed);
        self.shared.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A thread's work: it owns its connection and returns what the workload wants to know of it.
pub type ThreadBody<'run, T> =
    Box<dyn FnOnce(&mut ThreadContext) -> Result<T, ClientError> + Send + 'run>;

/// What a run measured, all threads merged.
pub struct Measured<T> {
    pub elapsed: Duration,
    pub interrupted: bool,
    pub errors: u64,
    /// Per kind, in the order of the run's kind names.
    pub kinds: Vec<(String, KindTotals)>,
    pub all: KindTotals,
    pub samples: Vec<ThroughputSample>,
    /// Each thread's own result, in thread order.
    pub threads: Vec<T>,
}

/// Run `bodies` (one thread each) until `bounds`; `kind_names` name the kinds the bodies record.
pub fn run<T: Send>(
    kind_names: &[&str],
    bounds: Bounds,
    bodies: Vec<ThreadBody<'_, T>>,
) -> Result<Measured<T>, String> {
    assert!(!kind_names.is_empty());
    assert!(!bodies.is_empty(), "a run needs at least one thread");
    let shared = Shared {
        stop: AtomicBool::new(false),
        claimed: AtomicU64::new(0),
        operations: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        finished_threads: AtomicUsize::new(0),
        operations_max: bounds.operations.unwrap_or(u64::MAX),
    };
    let threads = bodies.len();
    let started = Instant::now();
    let (samples, outcomes) = std::thread::scope(|scope| {
        let handles: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                let shared = &shared;
                scope.spawn(move || {
                    let mut context = ThreadContext {
                        shared,
                        kinds: kind_names.iter().map(|_| KindTotals::new()).collect(),
                        errors: 0,
                    };
                    let outcome = body(&mut context);
                    let finished = Instant::now();
                    if outcome.is_err() {
                        // One failed connection ends the run: its figures would be skewed.
                        shared.stop.store(true, Ordering::Relaxed);
                    }
                    shared.finished_threads.fetch_add(1, Ordering::Relaxed);
                    outcome.map(|result| (result, context.kinds, context.errors, finished))
                })
            })
            .collect();
        let samples = watch(&shared, threads, bounds.duration, started);
        let outcomes: Vec<_> = handles
            .into_iter()
            .map(|handle| handle.join().expect("a workload thread panicked"))
            .collect();
        (samples, outcomes)
    });

    let mut kinds: Vec<(String, KindTotals)> = kind_names
        .iter()
        .map(|name| (name.to_string(), KindTotals::new()))
        .collect();
    let mut all = KindTotals::new();
    let mut errors = 0;
    let mut results = Vec::with_capacity(threads);
    // The run lasted until its last thread finished, not until the watcher noticed.
    let mut elapsed = Duration::ZERO;
    for outcome in outcomes {
        let (result, thread_kinds, thread_errors, finished) =
            outcome.map_err(|error| format!("a connection failed: {error}"))?;
        elapsed = elapsed.max(finished - started);
        for ((_, merged), totals) in kinds.iter_mut().zip(thread_kinds) {
            merged.operations += totals.operations;
            merged.bytes += totals.bytes;
            merged.latencies.merge(&totals.latencies);
            all.operations += totals.operations;
            all.bytes += totals.bytes;
            all.latencies.merge(&totals.latencies);
        }
        errors += thread_errors;
        results.push(result);
    }
    Ok(Measured {
        elapsed,
        interrupted: interrupt::interrupted(),
        errors,
        kinds,
        all,
        samples,
        threads: results,
    })
}

/// The main thread's part of a run: sample throughput once a second, print progress, and raise
/// the stop flag when the duration is up, on Ctrl-C, or when every thread is done.
fn watch(
    shared: &Shared,
    threads: usize,
    duration: Option<Duration>,
    started: Instant,
) -> Vec<ThroughputSample> {
    let mut samples = Vec::new();
    let mut next_sample = SAMPLE_INTERVAL;
    let (mut last_at, mut last_operations, mut last_bytes) = (Duration::ZERO, 0, 0);
    loop {
        std::thread::sleep(POLL_INTERVAL.min(next_sample.saturating_sub(started.elapsed())));
        let now = started.elapsed();
        let over = shared.finished_threads.load(Ordering::Relaxed) == threads
            || shared.stop.load(Ordering::Relaxed)
            || interrupt::interrupted()
            || duration.is_some_and(|duration| now >= duration);
        if now >= next_sample || over {
            let operations = shared.operations.load(Ordering::Relaxed);
            let bytes = shared.bytes.load(Ordering::Relaxed);
            let interval = now - last_at;
            if interval >= SAMPLE_INTERVAL_MIN {
                let seconds = interval.as_secs_f64();
                samples.push(ThroughputSample {
                    at_seconds: now.as_secs_f64(),
                    operations_per_second: (operations - last_operations) as f64 / seconds,
                    mebibytes_per_second: (bytes - last_bytes) as f64
                        / BYTES_PER_MEBIBYTE
                        / seconds,
                });
            }
            if now >= next_sample {
                eprintln!(
                    "{:>5.0} s  {:>10.0} ops/s  {:>9.1} MiB/s  (so far {:.0} ops/s, {operations} ops)",
                    now.as_secs_f64(),
                    (operations - last_operations) as f64 / interval.as_secs_f64(),
                    (bytes - last_bytes) as f64 / BYTES_PER_MEBIBYTE / interval.as_secs_f64(),
                    operations as f64 / now.as_secs_f64(),
                );
                next_sample += SAMPLE_INTERVAL;
            }
            (last_at, last_operations, last_bytes) = (now, operations, bytes);
        }
        if over {
            shared.stop.store(true, Ordering::Relaxed);
            if interrupt::interrupted() {
                eprintln!("interrupted: finishing the operations in flight");
            }
            return samples;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_bound_hands_out_each_number_once() {
        let bodies: Vec<ThreadBody<Vec<u64>>> = (0..4)
            .map(|_| {
                Box::new(|context: &mut ThreadContext| {
                    let mut numbers = Vec::new();
                    while let Some(number) = context.next() {
                        context.record(0, Duration::from_micros(number + 1), 10);
                        numbers.push(number);
                    }
                    Ok(numbers)
                }) as ThreadBody<Vec<u64>>
            })
            .collect();
        let bounds = Bounds {
            duration: None,
            operations: Some(1_000),
        };
        let measured = run(&["op"], bounds, bodies).expect("run");
        let mut numbers: Vec<u64> = measured.threads.into_iter().flatten().collect();
        numbers.sort();
        assert_eq!(numbers, (0..1_000).collect::<Vec<_>>());
        assert_eq!(measured.all.operations, 1_000);
        assert_eq!(measured.all.bytes, 10_000);
        assert_eq!(measured.kinds[0].1.latencies.count(), 1_000);
    }

    #[test]
    fn a_duration_bound_stops_the_threads() {
        let bodies: Vec<ThreadBody<()>> = (0..2)
            .map(|_| {
                Box::new(|context: &mut ThreadContext| {
                    while context.next().is_some() {
                        std::thread::sleep(Duration::from_millis(1));
                        context.record(0, Duration::from_millis(1), 1);
                    }
                    Ok(())
                }) as ThreadBody<()>
            })
            .collect();
        let bounds = Bounds {
            duration: Some(Duration::from_millis(300)),
            operations: None,
        };
        let measured = run(&["op"], bounds, bodies).expect("run");
        assert!(measured.elapsed < Duration::from_secs(5));
        assert!(measured.all.operations > 0);
    }
}
