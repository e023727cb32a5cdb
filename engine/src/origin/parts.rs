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

use super::journal::{self, Record};
use super::remote::{self, Completion, PartAnswer};
use super::writeback::{read_part, Upload, Uploader};
use super::{OriginConfig, Origins, Route};
use crate::store::ObjectKey;
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
    /// Whether an upload of `path` to `route` goes on with this one: the same origin (by URL:
    /// a default-origin bucket's route may be forgotten and built anew between two attempts)
    /// and the same path.
    fn continues(&self, route: &Route, path: &Path) -> bool {
        self.route.url == route.url && self.path == *path
    }

    /// Abort it at the origin, in the background (the origin pool runs it to the end).
    pub fn abort(self, origins: &Origins) {
        drop(origins.run(remote::abort_upload(self.route, self.path, self.id)));
    }

    /// Its record on NVMe, for `upload`'s version.
    fn record(&self, upload: &Upload) -> Record {
        Record {
            seq: upload.seq,
            bytes: upload.bytes,
            part_bytes: self.part_bytes,
            origin: self.route.url.clone(),
            path: self.path.to_string(),
            id: self.id.clone(),
            parts: self.parts.clone(),
        }
    }
}

/// The upload of `upload`'s version to `path` that a record on NVMe says is open at the origin
/// (left by a run that stopped before completing it), to go on with. A record of another
/// version or place is forgotten, and its upload aborted where it was bound for this origin.
async fn recorded(
    uploader: &Uploader,
    recorder: &journal::Recorder,
    route: &Arc<Route>,
    upload: &Upload,
    path: &Path,
) -> Option<Begun> {
    // What earlier attempts handed is written before the record is read.
    recorder.settled().await;
    let record = journal::load(&uploader.store, &upload.key).await?;
    if record.seq == upload.seq
        && record.bytes == upload.bytes
        && record.origin == route.url
        && record.path == path.as_ref()
    {
        log::info!(
            "resuming the upload of {}/{} to {}: {} of {} parts are there",
            upload.key.bucket(),
            upload.key.key(),
            route.url,
            record.parts.iter().flatten().count(),
            record.parts.len()
        );
        return Some(Begun {
            route: route.clone(),
            path: path.clone(),
            id: record.id,
            part_bytes: record.part_bytes,
            parts: record.parts,
        });
    }
    if record.origin == route.url {
        let origins = &uploader.origin.origins;
        drop(origins.run(remote::abort_upload(
            route.clone(),
            record.path(),
            record.id,
        )));
    }
    recorder.forget(record.seq);
    recorder.settled().await;
    None
}

/// At the uploader's start: forget the records of uploads whose version is no longer the dirty
/// one stored (replaced, deleted or uploaded before the record could be deleted), aborting
/// their uploads at the origin. Runs before the first upload starts.
pub(crate) async fn sweep_records(uploader: &Uploader) {
    let Ok(prefix) = ObjectKey::staged_prefix(journal::PREFIX) else {
        return;
    };
    let mut after = None;
    loop {
        let page = uploader.store.list(&prefix, after.as_ref(), 1000);
        let Some(last) = page.last() else {
            return;
        };
        after = ObjectKey::staged(&last.key).ok();
        for meta in &page {
            let Ok(record_key) = ObjectKey::staged(&meta.key) else {
                continue;
            };
            let Some(object) = journal::object_of(&record_key) else {
                continue;
            };
            let record = journal::load(&uploader.store, &object).await;
            let current = uploader.store.head(&object);
            let kept = match (&record, &current) {
                (Some(record), Some(current)) => current.dirty && current.seq == record.seq,
                _ => false,
            };
            if kept {
                continue;
            }
            if let Some(record) = record {
                let route = uploader.origin.origins.route(object.bucket());
                if let Ok(Some(route)) = route {
                    if route.url == record.origin && route.parts.is_some() {
                        drop(uploader.origin.origins.run(remote::abort_upload(
                            route,
                            record.path(),
                            record.id,
                        )));
                    }
                }
            }
            journal::forget(&uploader.store, &object).await;
        }
        if after.is_none() {
            return;
        }
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
    attributes: object_store::Attributes,
) -> Result<Option<Option<String>>> {
    let origins: Arc<Origins> = uploader.origin.origins.clone();
    let config = origins.config().clone();
    // Every record write of this object goes through its one queue, whichever attempt or
    // version hands it (see `journal::Records`); the loop below awaits nothing but its parts.
    let recorder = uploader.records.recorder(&uploader.store, &upload.key);
    let mut begun = match upload.begun.take() {
        Some(begun) if begun.continues(route, &path) => begun,
        other => {
            if let Some(stale) = other {
                stale.abort(&origins);
            }
            match recorded(uploader, &recorder, route, upload, &path).await {
                Some(begun) => begun,
                None => {
                    let id = origins
                        .run(remote::create_upload(
                            origins.clone(),
                            route.clone(),
                            path.clone(),
                            attributes,
                        ))
                        .await?;
                    let part_bytes = part_bytes_for(&config, upload.bytes);
                    let begun = Begun {
                        route: route.clone(),
                        path,
                        id,
                        part_bytes,
                        parts: vec![None; upload.bytes.div_ceil(part_bytes) as usize],
                    };
                    // Durable before any part goes, as the record of an upload to resume.
                    recorder.save(begun.record(upload));
                    recorder.settled().await;
                    begun
                }
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
            let target = Target {
                path: begun.path.clone(),
                id: begun.id.clone(),
                part_bytes: begun.part_bytes,
            };
            // A SlowDown pause is waited inside the part, so that the parts already in flight
            // are polled meanwhile.
            let pause = route.throttle.pause();
            in_flight.push(one_part(
                uploader, upload_ref, &origins, route, target, index, pause,
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
                recorder.save(begun.record(upload_ref));
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
            recorder.forget(upload_ref.seq);
            return Ok(None);
        }
        Some(Stop::Gone) => {
            recorder.forget(upload_ref.seq);
            return Err(Error::new(
                ErrorKind::OriginUnavailable,
                format!(
                    "origin {} forgot the upload of {}: it starts over",
                    route.url, begun.path
                ),
            ));
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
    if completion.is_ok() {
        recorder.forget(upload.seq);
    }
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

/// After `pause` (a SlowDown's), read part `index` from NVMe, within the node's budget of part
/// bytes in flight, and upload it.
async fn one_part(
    uploader: &Uploader,
    upload: &Upload,
    origins: &Arc<Origins>,
    route: &Arc<Route>,
    target: Target,
    index: usize,
    pause: Option<Duration>,
) -> PartEnd {
    if let Some(pause) = pause {
        crate::rt::time::sleep(pause).await;
    }
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

    fn route(url: &str) -> Arc<Route> {
        Arc::new(Route {
            store: Arc::new(object_store::memory::InMemory::new()),
            parts: None,
            prefix: None,
            write: super::super::WriteMode::Back,
            revalidate: super::super::Revalidate::Immutable,
            url: url.to_string(),
            listing_sorted: true,
            folder: None,
            throttle: Throttle::default(),
            signed: None,
        })
    }

    #[test]
    fn an_upload_goes_on_through_a_route_built_anew_for_the_same_origin() {
        let begun = Begun {
            route: route("s3://corp/data"),
            path: Path::from("data/big"),
            id: "upload-1".to_string(),
            part_bytes: 16 << 20,
            parts: vec![None; 3],
        };
        // A default-origin bucket's route is rebuilt once forgotten: another Arc, same origin.
        assert!(begun.continues(&route("s3://corp/data"), &Path::from("data/big")));
        assert!(!begun.continues(&route("s3://corp/other"), &Path::from("data/big")));
        assert!(!begun.continues(&route("s3://corp/data"), &Path::from("data/small")));
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
