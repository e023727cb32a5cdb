//! Counters of the server, kept per shard thread (no shared mutable state between shards) and
//! gathered, with the engine's own, into the Prometheus text format (by `prometheus-client`)
//! for `--metrics` and STATS.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hydrant_engine::ShardStats;
use hydrant_proto::Opcode;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histogram's buckets, in microseconds (the last is +Inf).
pub const LATENCY_BUCKETS_US: [u64; 8] = [50, 100, 250, 500, 1_000, 5_000, 25_000, 100_000];

#[derive(Clone, Debug, Default)]
pub struct ServerCounters {
    /// Requests answered, per opcode (indexed by the opcode's byte).
    pub requests: [u64; 16],
    /// Requests answered with a status other than OK.
    pub request_errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub connections_opened: u64,
    pub connections_closed: u64,
    /// Requests whose key another shard owns, sent there and back (the hop the shard-aware path
    /// skips).
    pub requests_forwarded: u64,
    /// GETs answered by the connection's reader as they arrived, from the DRAM tier (no task).
    pub answered_on_arrival: u64,
    /// Connections closed for saying no HELLO in time or for going quiet past the idle timeout.
    pub connections_timed_out: u64,
    /// Per opcode: counts per bucket of LATENCY_BUCKETS_US, then +Inf; and the sum in µs.
    pub latency_buckets: [[u64; 9]; 16],
    pub latency_sum_us: [u64; 16],
    /// Object bytes copied by the CPU on the way to a client, per path (`PATH_LOCAL`,
    /// `PATH_TCP`): in the engine (gathering parts, DRAM fills) and in the server (into the
    /// shared region; on TCP, into a vector when a key of another shard crosses threads). The
    /// kernel's socket copies are not counted (two more per byte on TCP: send and receive).
    pub copied_bytes: [u64; 2],
    /// Object bytes delivered to clients, per path.
    pub delivered_bytes: [u64; 2],
}

/// Index of the same-host path in the per-path counters.
pub const PATH_LOCAL: usize = 0;
/// Index of the TCP path in the per-path counters.
pub const PATH_TCP: usize = 1;
const PATH_NAMES: [&str; 2] = ["local", "tcp"];

/// Same-host regions mapped now, and their bytes (process-wide: they belong to connection
/// threads, not shards).
pub static LOCAL_REGIONS: AtomicU64 = AtomicU64::new(0);
pub static LOCAL_REGION_BYTES: AtomicU64 = AtomicU64::new(0);
/// Same-host regions registered with every shard's ring (read with READ_FIXED).
pub static LOCAL_REGIONS_REGISTERED: AtomicU64 = AtomicU64::new(0);
/// Same-host read rings open now, and the reads they have taken and not yet completed.
pub static LOCAL_RINGS: AtomicU64 = AtomicU64::new(0);
pub static LOCAL_RING_READS_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// Same-host connections open now.
pub static LOCAL_CONNECTIONS: AtomicU64 = AtomicU64::new(0);
/// Object bytes same-host clients wrote from their own memory (WRITE_MEMORY), read with
/// process_vm_readv; a counter.
pub static LOCAL_MEMORY_WRITE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Count `copied` bytes copied by the CPU to deliver `delivered` bytes on `path`.
pub(crate) fn count_copies(path: usize, copied: u64, delivered: u64) {
    count(|counters| {
        counters.copied_bytes[path] += copied;
        counters.delivered_bytes[path] += delivered;
    });
}

thread_local! {
    static COUNTERS: RefCell<ServerCounters> = RefCell::new(ServerCounters::default());
}

pub(crate) fn count(update: impl FnOnce(&mut ServerCounters)) {
    COUNTERS.with(|counters| update(&mut counters.borrow_mut()));
}

pub(crate) fn record_request(
    opcode: Opcode,
    ok: bool,
    elapsed: Duration,
    bytes_in: usize,
    bytes_out: usize,
) {
    let index = opcode as usize;
    let micros = elapsed.as_micros() as u64;
    let bucket = LATENCY_BUCKETS_US
        .iter()
        .position(|&bound| micros <= bound)
        .unwrap_or(LATENCY_BUCKETS_US.len());
    count(|counters| {
        counters.requests[index] += 1;
        counters.request_errors += u64::from(!ok);
        counters.bytes_in += bytes_in as u64;
        counters.bytes_out += bytes_out as u64;
        counters.latency_buckets[index][bucket] += 1;
        counters.latency_sum_us[index] += micros;
    });
}

/// This shard thread's counters.
pub fn snapshot() -> ServerCounters {
    COUNTERS.with(|counters| counters.borrow().clone())
}

/// A shard's engine stats, one sample per shard: (name, type, help, field).
#[allow(clippy::type_complexity)]
const ENGINE_METRICS: [(&str, MetricType, &str, fn(&ShardStats) -> u64); 46] = [
    (
        "hydrant_nvme_admitted_bytes",
        MetricType::Counter,
        "Bytes read from origins and admitted to NVMe.",
        |stats| stats.admission.admitted_bytes,
    ),
    (
        "hydrant_nvme_rejected_cold",
        MetricType::Counter,
        "Origin reads not admitted to a full NVMe tier: their key was not seen before.",
        |stats| stats.admission.rejected_cold,
    ),
    (
        "hydrant_nvme_rejected_budget",
        MetricType::Counter,
        "Origin reads not admitted to NVMe: the admission write budget was spent.",
        |stats| stats.admission.rejected_budget,
    ),
    (
        "hydrant_dirty_oldest_milliseconds",
        MetricType::Gauge,
        "How long the oldest write still on its way to the origin has waited since its PUT was acknowledged.",
        |stats| stats.dirty_oldest_ms,
    ),
    (
        "hydrant_plans",
        MetricType::Gauge,
        "Loader-order plans followed now.",
        |stats| stats.plans.active,
    ),
    (
        "hydrant_plan_keys",
        MetricType::Counter,
        "Keys announced in loader-order plans.",
        |stats| stats.plans.planned,
    ),
    (
        "hydrant_plan_prefetched",
        MetricType::Counter,
        "Objects read from origins ahead of their readers by plans.",
        |stats| stats.plans.prefetched,
    ),
    (
        "hydrant_plan_prefetched_bytes",
        MetricType::Counter,
        "Bytes read from origins ahead of their readers by plans.",
        |stats| stats.plans.prefetched_bytes,
    ),
    (
        "hydrant_plan_hits",
        MetricType::Counter,
        "Reads of keys a plan had read ahead (or was reading when they came).",
        |stats| stats.plans.hits,
    ),
    (
        "hydrant_plan_wasted",
        MetricType::Counter,
        "Objects a plan read ahead that no reader asked for before the plan ended.",
        |stats| stats.plans.wasted,
    ),
    (
        "hydrant_plans_idle_ended",
        MetricType::Counter,
        "Plans ended because no reader asked for one of their keys for their idle time.",
        |stats| stats.plans.idle_ended,
    ),
    (
        "hydrant_objects",
        MetricType::Gauge,
        "Objects stored.",
        |stats| stats.objects,
    ),
    (
        "hydrant_dram_hits",
        MetricType::Counter,
        "Reads answered by the DRAM tier.",
        |stats| stats.dram.hits,
    ),
    (
        "hydrant_dram_misses",
        MetricType::Counter,
        "Reads of stored objects the DRAM tier did not hold.",
        |stats| stats.dram.misses,
    ),
    (
        "hydrant_dram_bytes",
        MetricType::Gauge,
        "Bytes of objects held by the DRAM tier.",
        |stats| stats.dram.bytes,
    ),
    (
        "hydrant_dram_capacity_bytes",
        MetricType::Gauge,
        "The DRAM tier's capacity.",
        |stats| stats.dram.capacity_bytes,
    ),
    (
        "hydrant_object_bytes",
        MetricType::Gauge,
        "Bytes of object data stored.",
        |stats| stats.object_bytes,
    ),
    (
        "hydrant_regions",
        MetricType::Gauge,
        "Regions of the shard.",
        |stats| stats.regions,
    ),
    (
        "hydrant_regions_free",
        MetricType::Gauge,
        "Regions free for writing.",
        |stats| stats.regions_free,
    ),
    (
        "hydrant_engine_gets",
        MetricType::Counter,
        "Gets on the NVMe tier.",
        |stats| stats.counters.gets,
    ),
    (
        "hydrant_engine_hits",
        MetricType::Counter,
        "Gets that found the object on the NVMe tier.",
        |stats| stats.counters.hits,
    ),
    (
        "hydrant_engine_misses",
        MetricType::Counter,
        "Gets that did not find the object.",
        |stats| stats.counters.misses,
    ),
    (
        "hydrant_engine_puts",
        MetricType::Counter,
        "Puts made durable.",
        |stats| stats.counters.puts,
    ),
    (
        "hydrant_engine_deletes",
        MetricType::Counter,
        "Deletes made durable.",
        |stats| stats.counters.deletes,
    ),
    (
        "hydrant_device_read_bytes",
        MetricType::Counter,
        "Object bytes read from the devices.",
        |stats| stats.counters.bytes_read,
    ),
    (
        "hydrant_device_written_bytes",
        MetricType::Counter,
        "Object bytes written to the devices.",
        |stats| stats.counters.bytes_written,
    ),
    (
        "hydrant_log_bytes",
        MetricType::Counter,
        "Bytes the logs placed on the devices: entries of every kind with their headers and padding (against hydrant_device_written_bytes, what the device takes for what is stored).",
        |stats| stats.counters.log_bytes,
    ),
    (
        "hydrant_flushes",
        MetricType::Counter,
        "Group-commit flushes.",
        |stats| stats.flushes,
    ),
    (
        "hydrant_evictions",
        MetricType::Counter,
        "Objects evicted by reclaim.",
        |stats| stats.counters.evictions,
    ),
    (
        "hydrant_reclaims",
        MetricType::Counter,
        "Regions reclaimed.",
        |stats| stats.counters.reclaims,
    ),
    (
        "hydrant_checkpoints",
        MetricType::Counter,
        "Index checkpoints written.",
        |stats| stats.counters.checkpoints,
    ),
    (
        "hydrant_checkpoints_skipped",
        MetricType::Counter,
        "Index checkpoints not written for want of free regions.",
        |stats| stats.counters.checkpoints_skipped,
    ),
    (
        "hydrant_checkpoint_bytes",
        MetricType::Gauge,
        "Size of the newest index checkpoint written.",
        |stats| stats.counters.checkpoint_bytes,
    ),
    (
        "hydrant_checkpoint_pause_microseconds",
        MetricType::Gauge,
        "How long the newest index checkpoint held the shard to begin (its records are encoded and written a piece at a time after).",
        |stats| stats.counters.checkpoint_pause_us,
    ),
    (
        "hydrant_checkpoint_step_max_microseconds",
        MetricType::Gauge,
        "The longest step of the newest index checkpoint (encoding one piece of it), which the shard's readers may wait for.",
        |stats| stats.counters.checkpoint_step_max_us,
    ),
    (
        "hydrant_checkpoint_saved_records_max",
        MetricType::Gauge,
        "Most records changed while a checkpoint was taken and kept as they were for it.",
        |stats| stats.counters.checkpoint_saved_max,
    ),
    (
        "hydrant_shared_write_bytes",
        MetricType::Counter,
        "Object bytes written from same-host clients' shared memory.",
        |stats| stats.counters.shared_bytes_written,
    ),
    (
        "hydrant_shared_write_copied_bytes",
        MetricType::Counter,
        "Of those, bytes the CPU copied before writing them (each once).",
        |stats| stats.counters.shared_bytes_copied,
    ),
    (
        "hydrant_recovery_regions_scanned",
        MetricType::Gauge,
        "Log regions the last open scanned (those after its index checkpoint, or all).",
        |stats| stats.counters.regions_scanned,
    ),
    (
        "hydrant_receive_buffers",
        MetricType::Gauge,
        "Provided receive buffers of the shard, shared by its connections' multishot receives.",
        |stats| u64::from(stats.receive.buffers),
    ),
    (
        "hydrant_receive_buffers_lent",
        MetricType::Gauge,
        "Provided receive buffers holding bytes their connection has not copied out yet.",
        |stats| u64::from(stats.receive.buffers_lent),
    ),
    (
        "hydrant_receive_streams",
        MetricType::Counter,
        "Multishot receives started.",
        |stats| stats.receive.streams_started,
    ),
    (
        "hydrant_receive_buffer_shortages",
        MetricType::Counter,
        "Multishot receives that found no provided buffer free (a plain receive followed).",
        |stats| stats.receive.buffer_shortages,
    ),
    (
        "hydrant_receive_streams_cut",
        MetricType::Counter,
        "Multishot receives cancelled for holding 8 unread buffers (a stalled reader, or a burst).",
        |stats| stats.receive.streams_cut,
    ),
    (
        "hydrant_checksum_errors",
        MetricType::Counter,
        "Stored bytes that failed their checksum.",
        |stats| stats.counters.checksum_errors,
    ),
    (
        "hydrant_attribute_reads",
        MetricType::Counter,
        "Header blocks read for an object's attributes (Content-Type, metadata) not in the shard's cache.",
        |stats| stats.counters.attribute_reads,
    ),
];

/// A shard's server counters, one sample per shard: (name, help, field); all counters.
#[allow(clippy::type_complexity)]
const SERVER_METRICS: [(&str, &str, fn(&ServerCounters) -> u64); 8] = [
    (
        "hydrant_request_errors",
        "Requests answered with an error status.",
        |counters| counters.request_errors,
    ),
    (
        "hydrant_received_bytes",
        "Bytes of requests received.",
        |counters| counters.bytes_in,
    ),
    ("hydrant_sent_bytes", "Bytes of answers sent.", |counters| {
        counters.bytes_out
    }),
    (
        "hydrant_connections_opened",
        "Connections accepted.",
        |counters| counters.connections_opened,
    ),
    (
        "hydrant_connections_closed",
        "Connections closed.",
        |counters| counters.connections_closed,
    ),
    (
        "hydrant_requests_forwarded",
        "Requests for another shard's key, served there (one hop between cores each way).",
        |counters| counters.requests_forwarded,
    ),
    (
        "hydrant_requests_answered_on_arrival",
        "GETs answered from the DRAM tier by the connection's reader, without a task.",
        |counters| counters.answered_on_arrival,
    ),
    (
        "hydrant_connections_timed_out",
        "Connections closed for sending no HELLO in time or staying idle past the idle timeout.",
        |counters| counters.connections_timed_out,
    ),
];

/// What one scrape shows: every shard's engine stats and server counters, the engine-wide
/// origin side, and the first refused writes by name. Encoded by `prometheus-client` in the
/// Prometheus text format (0.0.4); the counting itself stays per shard thread (plain integers,
/// no atomics on the data path) and is read only when a scrape asks.
#[derive(Debug)]
struct Scrape {
    shards: Vec<(ShardStats, ServerCounters)>,
    origin: Option<hydrant_engine::OriginStats>,
    refused: Vec<hydrant_engine::FailedUpload>,
    s3: Option<crate::s3::S3Snapshot>,
}

/// The value of one sample, as its metric type encodes it.
fn sample(metric: &mut MetricEncoder, kind: MetricType, value: u64) -> fmt::Result {
    match kind {
        MetricType::Counter => metric.encode_counter::<NoLabelSet, u64, u64>(&value, None),
        _ => metric.encode_gauge(&value),
    }
}

/// One sample per shard, labelled with the shard's number.
fn per_shard(
    encoder: &mut DescriptorEncoder,
    (name, kind, help): (&str, MetricType, &str),
    shards: &[(ShardStats, ServerCounters)],
    value: impl Fn(&ShardStats, &ServerCounters) -> u64,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (stats, counters) in shards {
        let shard = [("shard", stats.shard.to_string())];
        sample(
            &mut metric.encode_family(&shard)?,
            kind,
            value(stats, counters),
        )?;
    }
    Ok(())
}

/// One sample with no labels.
fn single(
    encoder: &mut DescriptorEncoder,
    (name, kind, help): (&str, MetricType, &str),
    value: u64,
) -> fmt::Result {
    sample(
        &mut encoder.encode_descriptor(name, help, None, kind)?,
        kind,
        value,
    )
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let shards = &self.shards[..];
        for (name, kind, help, field) in ENGINE_METRICS {
            per_shard(&mut encoder, (name, kind, help), shards, |stats, _| {
                field(stats)
            })?;
        }
        encode_requests(&mut encoder, shards)?;
        for (name, help, field) in SERVER_METRICS {
            per_shard(
                &mut encoder,
                (name, MetricType::Counter, help),
                shards,
                |_, counters| field(counters),
            )?;
        }
        encode_paths(&mut encoder, shards)?;
        encode_local(&mut encoder)?;
        encode_latency(&mut encoder, shards)?;
        if let Some(origin) = &self.origin {
            encode_origin(&mut encoder, origin)?;
        }
        if let Some(s3) = &self.s3 {
            encode_s3(&mut encoder, s3)?;
        }
        encode_refused(&mut encoder, &self.refused)
    }
}

/// Requests answered, per shard and operation.
fn encode_requests(
    encoder: &mut DescriptorEncoder,
    shards: &[(ShardStats, ServerCounters)],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "hydrant_requests",
        "Requests answered, per operation.",
        None,
        MetricType::Counter,
    )?;
    for (stats, counters) in shards {
        for opcode in Opcode::ALL {
            let labels = [
                ("shard", stats.shard.to_string()),
                ("operation", format!("{opcode:?}")),
            ];
            metric
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, u64, u64>(
                    &counters.requests[opcode as usize],
                    None,
                )?;
        }
    }
    Ok(())
}

/// Object bytes copied and delivered, per path, summed over the shards.
fn encode_paths(
    encoder: &mut DescriptorEncoder,
    shards: &[(ShardStats, ServerCounters)],
) -> fmt::Result {
    for (name, help, field) in [
        (
            "hydrant_copied_bytes",
            "Object bytes copied by the CPU on the way to clients (kernel socket copies not counted).",
            (|counters: &ServerCounters, path: usize| counters.copied_bytes[path])
                as fn(&ServerCounters, usize) -> u64,
        ),
        (
            "hydrant_delivered_bytes",
            "Object bytes delivered to clients.",
            |counters: &ServerCounters, path: usize| counters.delivered_bytes[path],
        ),
    ] {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (path, path_name) in PATH_NAMES.iter().enumerate() {
            let total: u64 = shards
                .iter()
                .map(|(_, counters)| field(counters, path))
                .sum();
            metric
                .encode_family(&[("path", *path_name)])?
                .encode_counter::<NoLabelSet, u64, u64>(&total, None)?;
        }
    }
    Ok(())
}

/// The same-host path's process-wide gauges.
fn encode_local(encoder: &mut DescriptorEncoder) -> fmt::Result {
    for (name, help, value) in [
        (
            "hydrant_local_regions",
            "Same-host shared regions mapped now.",
            &LOCAL_REGIONS,
        ),
        (
            "hydrant_local_region_bytes",
            "Bytes of the same-host shared regions mapped now.",
            &LOCAL_REGION_BYTES,
        ),
        (
            "hydrant_local_regions_registered",
            "Same-host regions registered with every shard's ring (read with READ_FIXED).",
            &LOCAL_REGIONS_REGISTERED,
        ),
        (
            "hydrant_local_rings",
            "Same-host read rings open now.",
            &LOCAL_RINGS,
        ),
        (
            "hydrant_local_ring_reads_in_flight",
            "Reads the same-host rings have taken and not yet completed.",
            &LOCAL_RING_READS_IN_FLIGHT,
        ),
        (
            "hydrant_local_connections",
            "Same-host connections open now.",
            &LOCAL_CONNECTIONS,
        ),
    ] {
        single(
            encoder,
            (name, MetricType::Gauge, help),
            value.load(Ordering::Relaxed),
        )?;
    }
    single(
        encoder,
        (
            "hydrant_local_memory_write_bytes",
            MetricType::Counter,
            "Object bytes same-host clients wrote from their own memory (read from their process, then copied once more on the shard).",
        ),
        LOCAL_MEMORY_WRITE_BYTES.load(Ordering::Relaxed),
    )?;
    Ok(())
}

/// Request latency per operation, one histogram summed over the shards.
fn encode_latency(
    encoder: &mut DescriptorEncoder,
    shards: &[(ShardStats, ServerCounters)],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "hydrant_request_duration_seconds",
        "Time from a request's arrival to its answer being queued.",
        None,
        MetricType::Histogram,
    )?;
    for opcode in [Opcode::Get, Opcode::Put, Opcode::Head, Opcode::Delete] {
        let index = opcode as usize;
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_US
            .iter()
            .map(|&micros| micros as f64 / 1e6)
            .chain([f64::INFINITY])
            .enumerate()
            .map(|(bucket, bound)| {
                let count = shards
                    .iter()
                    .map(|(_, counters)| counters.latency_buckets[index][bucket])
                    .sum();
                (bound, count)
            })
            .collect();
        let count = buckets.iter().map(|(_, count)| count).sum();
        let sum_us: u64 = shards
            .iter()
            .map(|(_, counters)| counters.latency_sum_us[index])
            .sum();
        metric
            .encode_family(&[("operation", format!("{opcode:?}"))])?
            .encode_histogram::<NoLabelSet>(sum_us as f64 / 1e6, count, &buckets, None)?;
    }
    Ok(())
}

/// The S3 endpoint: requests per operation, answers per status class, connections.
fn encode_s3(encoder: &mut DescriptorEncoder, s3: &crate::s3::S3Snapshot) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(
        "hydrant_s3_requests",
        "S3 requests, per operation (other: any operation not named).",
        None,
        MetricType::Counter,
    )?;
    for (operation, count) in &s3.operations {
        metric
            .encode_family(&[("operation", *operation)])?
            .encode_counter::<NoLabelSet, u64, u64>(count, None)?;
    }
    let mut metric = encoder.encode_descriptor(
        "hydrant_s3_answers",
        "S3 answers, per status class (5xx: the node's trouble; 503 SlowDown when the dirty budget is full).",
        None,
        MetricType::Counter,
    )?;
    for (class, count) in crate::s3::S3_ANSWER_CLASSES.iter().zip(&s3.answers) {
        metric
            .encode_family(&[("status", *class)])?
            .encode_counter::<NoLabelSet, u64, u64>(count, None)?;
    }
    single(
        encoder,
        (
            "hydrant_s3_connections",
            MetricType::Counter,
            "S3 connections accepted.",
        ),
        s3.connections,
    )?;
    single(
        encoder,
        (
            "hydrant_s3_connections_refused",
            MetricType::Counter,
            "S3 connections closed on arrival because the endpoint served its most at once.",
        ),
        s3.refused_connections,
    )?;
    single(
        encoder,
        (
            "hydrant_s3_plain_gets",
            MetricType::Counter,
            "GetObjects of a whole object or one range by an anonymous loopback client, answered without the S3 library's generic routing (counted among hydrant_s3_requests too).",
        ),
        s3.plain_gets,
    )
}

/// One gauge per refused write, named by labels (at most `REFUSED_NAMED_MAX`).
fn encode_refused(
    encoder: &mut DescriptorEncoder,
    refused: &[hydrant_engine::FailedUpload],
) -> fmt::Result {
    if refused.is_empty() {
        return Ok(());
    }
    let help = format!(
        "A write the origin refused for good, kept on NVMe (the first {REFUSED_NAMED_MAX})."
    );
    let mut metric = encoder.encode_descriptor(
        "hydrant_upload_refused_bytes",
        &help,
        None,
        MetricType::Gauge,
    )?;
    for failed in refused {
        let labels = [("bucket", &failed.bucket), ("key", &failed.key)];
        metric.encode_family(&labels)?.encode_gauge(&failed.bytes)?;
    }
    Ok(())
}

/// The Prometheus text format of a scrape.
fn render(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut text = String::new();
    prometheus_text::encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

/// Every shard's engine stats and server counters, rendered.
pub fn gather(
    engine: &hydrant_engine::EngineHandle,
) -> impl std::future::Future<Output = hydrant_engine::Result<String>> + Send + 'static {
    let calls: Vec<_> = (0..engine.shard_count())
        .map(|shard| {
            engine.on_shard(
                shard,
                |cache| async move { Ok((cache.stats(), snapshot())) },
            )
        })
        .collect();
    let origin = engine.origin_stats();
    let refused = origin
        .is_some()
        .then(|| engine.refused_uploads(None, "", false, REFUSED_NAMED_MAX));
    async move {
        let mut shards = Vec::with_capacity(calls.len());
        for call in calls {
            shards.push(call.await?);
        }
        let refused = match refused {
            Some(refused) => refused.await?.0,
            None => Vec::new(),
        };
        Ok(render(Scrape {
            shards,
            origin,
            refused,
            s3: crate::s3::S3_COUNTERS.snapshot(),
        }))
    }
}

/// Refused writes named in the metrics (all of them: `hydrant uploads`).
const REFUSED_NAMED_MAX: usize = 20;

/// The origin traffic and the dirty budget (engine-wide, not per shard).
fn encode_origin(
    encoder: &mut DescriptorEncoder,
    origin: &hydrant_engine::OriginStats,
) -> fmt::Result {
    {
        let mut metric = encoder.encode_descriptor(
            "hydrant_origin_requests",
            "Requests sent to origins.",
            None,
            MetricType::Counter,
        )?;
        for (operation, count) in [
            ("get", origin.gets),
            ("head", origin.heads),
            ("put", origin.puts),
            ("list", origin.lists),
            ("delete", origin.deletes),
        ] {
            metric
                .encode_family(&[("operation", operation)])?
                .encode_counter::<NoLabelSet, u64, u64>(&count, None)?;
        }
    }
    {
        let mut metric = encoder.encode_descriptor(
            "hydrant_upload_clean_seconds",
            "Time from a write-back PUT's acknowledgement to its version being at the origin.",
            None,
            MetricType::Histogram,
        )?;
        let buckets: Vec<(f64, u64)> = hydrant_engine::origin::CLEAN_BUCKETS_MS
            .iter()
            .map(|&millis| millis as f64 / 1e3)
            .chain([f64::INFINITY])
            .zip(origin.clean_buckets)
            .collect();
        let count = origin.clean_buckets.iter().sum();
        metric.encode_histogram::<NoLabelSet>(
            origin.clean_sum_ms as f64 / 1e3,
            count,
            &buckets,
            None,
        )?;
    }
    let single_metrics: [(&str, MetricType, &str, u64); 11] = [
        (
            "hydrant_upload_parts_in_flight",
            MetricType::Gauge,
            "Parts of multipart uploads being read or sent to the origin now.",
            origin.parts_in_flight,
        ),
        (
            "hydrant_upload_part_bytes_in_flight",
            MetricType::Gauge,
            "Bytes of those parts (bounded by the part budget).",
            origin.part_bytes_in_flight,
        ),
        (
            "hydrant_origin_slow_downs",
            MetricType::Counter,
            "Parts the origin answered with SlowDown or 503 (uploads to its prefix paused).",
            origin.slow_downs,
        ),
        (
            "hydrant_origin_errors",
            MetricType::Counter,
            "Origin requests that failed.",
            origin.errors,
        ),
        (
            "hydrant_origin_received_bytes",
            MetricType::Counter,
            "Bytes read from origins.",
            origin.bytes_in,
        ),
        (
            "hydrant_origin_sent_bytes",
            MetricType::Counter,
            "Bytes uploaded to origins.",
            origin.bytes_out,
        ),
        (
            "hydrant_origin_upload_retries",
            MetricType::Counter,
            "Upload attempts that failed and were retried.",
            origin.uploads_retried,
        ),
        (
            "hydrant_dirty_bytes",
            MetricType::Gauge,
            "Bytes written here and not yet at the origin (budget taken).",
            origin.dirty_bytes,
        ),
        (
            "hydrant_dirty_bytes_max",
            MetricType::Gauge,
            "The dirty-byte budget.",
            origin.dirty_bytes_max,
        ),
        (
            "hydrant_uploads_refused",
            MetricType::Gauge,
            "Writes the origin refused for good, kept on NVMe until retried, replaced or deleted.",
            origin.failed_uploads,
        ),
        (
            "hydrant_uploads_refused_bytes",
            MetricType::Gauge,
            "Bytes of writes the origin refused, apart from the dirty budget.",
            origin.failed_bytes,
        ),
    ];
    for (name, kind, help, value) in single_metrics {
        single(encoder, (name, kind, help), value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> Scrape {
        let shard = |number: u32, objects: u64| {
            let stats = ShardStats {
                shard: number,
                objects,
                ..ShardStats::default()
            };
            let mut counters = ServerCounters::default();
            counters.requests[Opcode::Get as usize] = 3 + u64::from(number);
            counters.latency_buckets[Opcode::Get as usize][0] = 2;
            counters.latency_buckets[Opcode::Get as usize][8] = 1 + u64::from(number);
            counters.latency_sum_us[Opcode::Get as usize] = 500_000;
            (stats, counters)
        };
        Scrape {
            shards: vec![shard(0, 5), shard(1, 7)],
            origin: Some(hydrant_engine::OriginStats {
                gets: 9,
                dirty_bytes_max: 64 << 20,
                ..Default::default()
            }),
            refused: vec![hydrant_engine::FailedUpload {
                bucket: "b".into(),
                key: "a \"quoted\"\nkey\\".into(),
                seq: 1,
                bytes: 42,
                reason: "no permission".into(),
            }],
            s3: Some(crate::s3::S3Snapshot {
                operations: vec![("GetObject", 12), ("UploadPart", 3)],
                answers: [14, 0, 1, 0],
                connections: 2,
                refused_connections: 0,
                plain_gets: 10,
            }),
        }
    }

    #[test]
    fn a_scrape_is_prometheus_text_with_every_shard_labelled() {
        let text = render(scrape());
        let lines: Vec<&str> = text.lines().collect();
        for expected in [
            "# HELP hydrant_objects Objects stored.",
            "# TYPE hydrant_objects gauge",
            "hydrant_objects{shard=\"0\"} 5",
            "hydrant_objects{shard=\"1\"} 7",
            "# TYPE hydrant_engine_puts_total counter",
            "hydrant_requests_total{shard=\"1\",operation=\"Get\"} 4",
            "hydrant_origin_requests_total{operation=\"get\"} 9",
            "hydrant_dirty_bytes_max 67108864",
            // Buckets are cumulative across shards; +Inf counts everything.
            "# TYPE hydrant_request_duration_seconds histogram",
            "hydrant_request_duration_seconds_bucket{operation=\"Get\",le=\"5e-05\"} 4",
            "hydrant_request_duration_seconds_bucket{operation=\"Get\",le=\"+Inf\"} 7",
            "hydrant_request_duration_seconds_sum{operation=\"Get\"} 1.0",
            "hydrant_request_duration_seconds_count{operation=\"Get\"} 7",
            // A refused key's quote, newline and backslash are escaped.
            "hydrant_upload_refused_bytes{bucket=\"b\",key=\"a \\\"quoted\\\"\\nkey\\\\\"} 42",
            "hydrant_s3_requests_total{operation=\"UploadPart\"} 3",
            "hydrant_s3_answers_total{status=\"4xx\"} 1",
            "hydrant_s3_connections_total 2",
            "hydrant_s3_plain_gets_total 10",
        ] {
            assert!(lines.contains(&expected), "{expected}\n{text}");
        }
        // Every sample belongs to a metric announced with HELP and TYPE.
        let mut announced = Vec::new();
        for line in &lines {
            if let Some(name) = line.strip_prefix("# TYPE ") {
                announced.push(name.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    announced
                        .iter()
                        .any(|metric| name.starts_with(metric.as_str())),
                    "{line}"
                );
            }
        }
    }
}
