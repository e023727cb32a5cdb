//! Multipart write-back to an object store, driven part by part: the part size chosen for the
//! object, several parts in flight at once within a node-wide byte budget, SlowDown answered by
//! pausing the origin prefix, and an upload that a failed attempt leaves open resumed by the
//! next attempt from the parts the origin already holds.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use object_store::multipart::PartId;
use object_store::path::Path;
use object_store::MultipartId;

use super::remote::{self, Completion, PartAnswer};
use super::writeback::{read_part, Upload, Uploader};
use super::{OriginConfig, Origins, Route};
use crate::{Error, ErrorKind, Result};

/// The most parts S3 allows in one upload.
pub const PARTS_PER_UPLOAD_MAX: u64 = 10_000;

/// The largest part S3 allows.
pub const PART_BYTES_LARGEST: u64 = 5 << 30;

/// SlowDown answers in a row, with no part accepted between them, after which an attempt gives
/// up (the upload waits its backoff and goes on from its parts).
const SLOW_DOWNS_IN_A_ROW_MAX: u32 = 10;

/// The part size for an object of `bytes`: the configured size, or larger where the object would
/// otherwise need more than S3's 10,000 parts (rounded up to a MiB).
pub fn part_bytes_for(config: &OriginConfig, bytes: u64) -> u64 {
    let least = bytes
        .div_ceil(PARTS_PER_UPLOAD_MAX)
        .next_multiple_of(1 << 20);
    config.part_bytes.max(least).min(PART_BYTES_LARGEST)
}

/// How SlowDown answers from one origin prefix (a route) slow the uploads to it, on every shard:
/// each pushes back the time before which no new part starts there, by 100 ms doubling to 10 s
/// while they keep coming; each part the origin accepts halves the level again.
#[derive(Default)]
pub(crate) struct Throttle {
    /// Milliseconds since `epoch()` before which no part starts.
    until_ms: AtomicU64,
    level: AtomicU32,
}

fn epoch_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Throttle {
    fn slowed(&self) {
        let level = self.level.fetch_add(1, Ordering::Relaxed).min(7);
        let pause = (100u64 << level).min(10_000);
        self.until_ms
            .fetch_max(epoch_ms() + pause, Ordering::Relaxed);
    }

    fn accepted(&self) {
        let _ = self
            .level
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |level| {
                (level > 0).then_some(level / 2)
            });
    }

    /// How long to wait before the next part may start.
    fn pause(&self) -> Option<Duration> {
        let until = self.until_ms.load(Ordering::Relaxed);
        let now = epoch_ms();
        (until > now).then(|| Duration::from_millis(until - now))
    }
}

/// A multipart upload open at the origin: where, its id, its part size, and the parts the
/// origin holds (by index; `None` not yet).
pub(crate) struct Begun {
    route: Arc<Route>,
    path: Path,
    id: MultipartId,
    part_bytes: u64,
    parts: Vec<Option<PartId>>,
}

impl Begun {
    /// Abort it at the origin, in the background (the origin pool runs it to the end).
    pub fn abort(self, origins: &Origins) {
        drop(origins.run(remote::abort_upload(self.route, self.path, self.id)));
    }
}

/// Counts a part in flight in the node's gauges for as long as it lives.
struct InFlight<'a> {
    origins: &'a Origins,
    bytes: u64,
}

impl<'a> InFlight<'a> {
    fn new(origins: &'a Origins, bytes: u64) -> Self {
        origins
            .counters
            .parts_in_flight
            .fetch_add(1, Ordering::Relaxed);
        origins
            .counters
            .part_bytes_in_flight
            .fetch_add(bytes, Ordering::Relaxed);
        InFlight { origins, bytes }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let counters = &self.origins.counters;
        counters.parts_in_flight.fetch_sub(1, Ordering::Relaxed);
        counters
            .part_bytes_in_flight
            .fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What became of one part.
enum PartEnd {
    Uploaded(usize, PartId),
    SlowDown(usize),
    /// The version stopped being the stored one.
    Moot,
    /// The origin no longer knows the upload.
    Gone,
    Failed(Error),
}

/// Why an attempt stops before completing.
enum Stop {
    Moot,
    Gone,
    Failed(Error),
}

/// Where a part goes.
struct Target {
    path: Path,
    id: MultipartId,
    part_bytes: u64,
}

/// Upload `upload` to `route` (an object store) in parts, going on from the upload an earlier
/// attempt left open; `Ok(None)` when it stopped being the stored version midway, else the
/// origin's ETag (when it gives one). On a failure the open upload stays on `upload` for the
/// next attempt.
pub(crate) async fn upload_in_parts(
    uploader: &Uploader,
    route: &Arc<Route>,
    upload: &mut Upload,
    path: Path,
) -> Result<Option<Option<String>>> {
    let origins: Arc<Origins> = uploader.origin.origins.clone();
    let config = origins.config().clone();
    let mut begun = match upload.begun.take() {
        Some(begun) if Arc::ptr_eq(&begun.route, route) && begun.path == path => begun,
        other => {
            if let Some(stale) = other {
                stale.abort(&origins);
            }
            let id = origins
                .run(remote::create_upload(
                    origins.clone(),
                    route.clone(),
                    path.clone(),
                ))
                .await?;
            let part_bytes = part_bytes_for(&config, upload.bytes);
            Begun {
                route: route.clone(),
                path,
                id,
                part_bytes,
                parts: vec![None; upload.bytes.div_ceil(part_bytes) as usize],
            }
        }
    };
    let mut missing: Vec<usize> = (0..begun.parts.len())
        .rev()
        .filter(|&index| begun.parts[index].is_none())
        .collect();
    let mut in_flight = FuturesUnordered::new();
    let mut stop = None;
    let mut slow_downs_in_a_row = 0;
    let upload_ref: &Upload = upload;
    loop {
        while stop.is_none() && in_flight.len() < config.parts_in_flight_per_upload_max {
            let Some(index) = missing.pop() else {
                break;
            };
            if let Some(pause) = route.throttle.pause() {
                crate::rt::time::sleep(pause).await;
            }
            let target = Target {
                path: begun.path.clone(),
                id: begun.id.clone(),
                part_bytes: begun.part_bytes,
            };
            in_flight.push(one_part(
                uploader, upload_ref, &origins, route, target, index,
            ));
        }
        let Some(end) = in_flight.next().await else {
            break;
        };
        match end {
            PartEnd::Uploaded(index, part) => {
                route.throttle.accepted();
                slow_downs_in_a_row = 0;
                begun.parts[index] = Some(part);
            }
            PartEnd::SlowDown(index) => {
                route.throttle.slowed();
                slow_downs_in_a_row += 1;
                missing.push(index);
                if slow_downs_in_a_row >= SLOW_DOWNS_IN_A_ROW_MAX {
                    stop.get_or_insert(Stop::Failed(Error::new(
                        ErrorKind::OriginUnavailable,
                        format!(
                            "origin {} answered SlowDown {slow_downs_in_a_row} times in a row",
                            route.url
                        ),
                    )));
                }
            }
            PartEnd::Moot => {
                stop = Some(Stop::Moot);
            }
            PartEnd::Gone => {
                stop.get_or_insert(Stop::Gone);
            }
            PartEnd::Failed(error) => {
                stop.get_or_insert(Stop::Failed(error));
            }
        }
    }
    drop(in_flight);
    match stop {
        None => {}
        Some(Stop::Moot) => {
            begun.abort(&origins);
            return Ok(None);
        }
        Some(Stop::Gone) => {
            return Err(Error::new(
                ErrorKind::OriginUnavailable,
                format!(
                    "origin {} forgot the upload of {}: it starts over",
                    route.url, begun.path
                ),
            ))
        }
        Some(Stop::Failed(error)) => {
            upload.begun = Some(begun);
            return Err(error);
        }
    }
    let parts: Vec<PartId> = begun.parts.iter().flatten().cloned().collect();
    let completion = origins
        .run(remote::complete_upload(
            origins.clone(),
            route.clone(),
            begun.path.clone(),
            begun.id.clone(),
            parts,
            upload.bytes,
        ))
        .await;
    match completion {
        Ok(Completion::Done(etag)) => Ok(Some(etag)),
        Ok(Completion::Gone) => Err(Error::new(
            ErrorKind::OriginUnavailable,
            format!(
                "origin {} forgot the upload of {} before completing it: it starts over",
                route.url, begun.path
            ),
        )),
        Err(error) => {
            upload.begun = Some(begun);
            Err(error)
        }
    }
}

/// Read part `index` from NVMe, within the node's budget of part bytes in flight, and upload it.
async fn one_part(
    uploader: &Uploader,
    upload: &Upload,
    origins: &Arc<Origins>,
    route: &Arc<Route>,
    target: Target,
    index: usize,
) -> PartEnd {
    let start = index as u64 * target.part_bytes;
    let end = (start + target.part_bytes).min(upload.bytes);
    let _permit = origins.part_budget(end - start).await;
    let _counted = InFlight::new(origins, end - start);
    let data = match read_part(uploader, upload, start, end).await {
        Ok(Some(data)) => data,
        Ok(None) => return PartEnd::Moot,
        Err(error) => return PartEnd::Failed(error),
    };
    let answer = origins
        .run(remote::upload_part(
            origins.clone(),
            route.clone(),
            target.path,
            target.id,
            index,
            data,
        ))
        .await;
    match answer {
        Ok(PartAnswer::Uploaded(part)) => PartEnd::Uploaded(index, part),
        Ok(PartAnswer::SlowDown) => PartEnd::SlowDown(index),
        Ok(PartAnswer::Gone) => PartEnd::Gone,
        Err(error) => PartEnd::Failed(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_grow_past_the_configured_size_only_beyond_ten_thousand() {
        let config = OriginConfig::new();
        assert_eq!(part_bytes_for(&config, 1 << 30), 16 << 20);
        assert_eq!(part_bytes_for(&config, 10_000 * (16 << 20)), 16 << 20);
        let big = 10_000 * (16 << 20) + 1;
        let part = part_bytes_for(&config, big);
        assert!(part > 16 << 20 && part.is_multiple_of(1 << 20));
        assert!(big.div_ceil(part) <= PARTS_PER_UPLOAD_MAX);
        assert_eq!(part_bytes_for(&config, 5 << 40), 525 << 20);
    }

    #[test]
    fn a_slow_down_pauses_the_prefix_and_accepted_parts_lift_it() {
        let throttle = Throttle::default();
        assert!(throttle.pause().is_none());
        throttle.slowed();
        let first = throttle.pause().expect("paused");
        assert!(first <= Duration::from_millis(100));
        throttle.slowed();
        throttle.slowed();
        assert!(throttle.pause().unwrap() > Duration::from_millis(200));
        for _ in 0..3 {
            throttle.accepted();
        }
        assert_eq!(throttle.level.load(Ordering::Relaxed), 0);
    }
}
