//! Counters of the server, kept per shard thread (no shared mutable state between shards) and
//! gathered, with the engine's own, into the Prometheus text format for `--metrics` and STATS.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hydrant_engine::ShardStats;
use hydrant_proto::Opcode;

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
/// Same-host connections open now.
pub static LOCAL_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

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

fn metric(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The Prometheus text format of every shard's engine stats and server counters.
pub fn render(shards: &[(ShardStats, ServerCounters)]) -> String {
    let mut out = String::new();
    type Field = fn(&ShardStats) -> u64;
    let engine_metrics: [(&str, &str, &str, Field); 27] = [
        (
            "hydrant_nvme_admitted_bytes_total",
            "counter",
            "Bytes read from origins and admitted to NVMe.",
            |stats| stats.admission.admitted_bytes,
        ),
        (
            "hydrant_nvme_rejected_cold_total",
            "counter",
            "Origin reads not admitted to a full NVMe tier: their key was not seen before.",
            |stats| stats.admission.rejected_cold,
        ),
        (
            "hydrant_nvme_rejected_budget_total",
            "counter",
            "Origin reads not admitted to NVMe: the admission write budget was spent.",
            |stats| stats.admission.rejected_budget,
        ),
        ("hydrant_objects", "gauge", "Objects stored.", |stats| {
            stats.objects
        }),
        (
            "hydrant_dram_hits_total",
            "counter",
            "Reads answered by the DRAM tier.",
            |stats| stats.dram.hits,
        ),
        (
            "hydrant_dram_misses_total",
            "counter",
            "Reads of stored objects the DRAM tier did not hold.",
            |stats| stats.dram.misses,
        ),
        (
            "hydrant_dram_bytes",
            "gauge",
            "Bytes of objects held by the DRAM tier.",
            |stats| stats.dram.bytes,
        ),
        (
            "hydrant_dram_capacity_bytes",
            "gauge",
            "The DRAM tier's capacity.",
            |stats| stats.dram.capacity_bytes,
        ),
        (
            "hydrant_object_bytes",
            "gauge",
            "Bytes of object data stored.",
            |stats| stats.object_bytes,
        ),
        (
            "hydrant_regions",
            "gauge",
            "Regions of the shard.",
            |stats| stats.regions,
        ),
        (
            "hydrant_regions_free",
            "gauge",
            "Regions free for writing.",
            |stats| stats.regions_free,
        ),
        (
            "hydrant_engine_gets_total",
            "counter",
            "Gets on the NVMe tier.",
            |stats| stats.counters.gets,
        ),
        (
            "hydrant_engine_hits_total",
            "counter",
            "Gets that found the object on the NVMe tier.",
            |stats| stats.counters.hits,
        ),
        (
            "hydrant_engine_misses_total",
            "counter",
            "Gets that did not find the object.",
            |stats| stats.counters.misses,
        ),
        (
            "hydrant_engine_puts_total",
            "counter",
            "Puts made durable.",
            |stats| stats.counters.puts,
        ),
        (
            "hydrant_engine_deletes_total",
            "counter",
            "Deletes made durable.",
            |stats| stats.counters.deletes,
        ),
        (
            "hydrant_device_read_bytes_total",
            "counter",
            "Object bytes read from the devices.",
            |stats| stats.counters.bytes_read,
        ),
        (
            "hydrant_device_written_bytes_total",
            "counter",
            "Object bytes written to the devices.",
            |stats| stats.counters.bytes_written,
        ),
        (
            "hydrant_flushes_total",
            "counter",
            "Group-commit flushes.",
            |stats| stats.flushes,
        ),
        (
            "hydrant_evictions_total",
            "counter",
            "Objects evicted by reclaim.",
            |stats| stats.counters.evictions,
        ),
        (
            "hydrant_reclaims_total",
            "counter",
            "Regions reclaimed.",
            |stats| stats.counters.reclaims,
        ),
        (
            "hydrant_receive_buffers",
            "gauge",
            "Provided receive buffers of the shard, shared by its connections' multishot receives.",
            |stats| u64::from(stats.receive.buffers),
        ),
        (
            "hydrant_receive_buffers_lent",
            "gauge",
            "Provided receive buffers holding bytes their connection has not copied out yet.",
            |stats| u64::from(stats.receive.buffers_lent),
        ),
        (
            "hydrant_receive_streams_total",
            "counter",
            "Multishot receives started.",
            |stats| stats.receive.streams_started,
        ),
        (
            "hydrant_receive_buffer_shortages_total",
            "counter",
            "Multishot receives that found no provided buffer free (a plain receive followed).",
            |stats| stats.receive.buffer_shortages,
        ),
        (
            "hydrant_receive_streams_cut_total",
            "counter",
            "Multishot receives cancelled for holding 8 unread buffers (a stalled reader, or a burst).",
            |stats| stats.receive.streams_cut,
        ),
        (
            "hydrant_checksum_errors_total",
            "counter",
            "Stored bytes that failed their checksum.",
            |stats| stats.counters.checksum_errors,
        ),
    ];
    for (name, kind, help, field) in engine_metrics {
        metric(&mut out, name, kind, help);
        for (stats, _) in shards {
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {}", stats.shard, field(stats));
        }
    }
    metric(
        &mut out,
        "hydrant_requests_total",
        "counter",
        "Requests answered, per operation.",
    );
    for (stats, counters) in shards {
        for opcode in Opcode::ALL {
            let _ = writeln!(
                out,
                "hydrant_requests_total{{shard=\"{}\",operation=\"{opcode:?}\"}} {}",
                stats.shard, counters.requests[opcode as usize]
            );
        }
    }
    type CounterField = fn(&ServerCounters) -> u64;
    let server_metrics: [(&str, &str, CounterField); 8] = [
        (
            "hydrant_request_errors_total",
            "Requests answered with an error status.",
            |counters| counters.request_errors,
        ),
        (
            "hydrant_received_bytes_total",
            "Bytes of requests received.",
            |counters| counters.bytes_in,
        ),
        (
            "hydrant_sent_bytes_total",
            "Bytes of answers sent.",
            |counters| counters.bytes_out,
        ),
        (
            "hydrant_connections_opened_total",
            "Connections accepted.",
            |counters| counters.connections_opened,
        ),
        (
            "hydrant_connections_closed_total",
            "Connections closed.",
            |counters| counters.connections_closed,
        ),
        (
            "hydrant_requests_forwarded_total",
            "Requests for another shard's key, served there (one hop between cores each way).",
            |counters| counters.requests_forwarded,
        ),
        (
            "hydrant_requests_answered_on_arrival_total",
            "GETs answered from the DRAM tier by the connection's reader, without a task.",
            |counters| counters.answered_on_arrival,
        ),
        (
            "hydrant_connections_timed_out_total",
            "Connections closed for sending no HELLO in time or staying idle past the idle timeout.",
            |counters| counters.connections_timed_out,
        ),
    ];
    for (name, help, field) in server_metrics {
        metric(&mut out, name, "counter", help);
        for (stats, counters) in shards {
            let _ = writeln!(
                out,
                "{name}{{shard=\"{}\"}} {}",
                stats.shard,
                field(counters)
            );
        }
    }
    for (name, help, field) in [
        (
            "hydrant_copied_bytes_total",
            "Object bytes copied by the CPU on the way to clients (kernel socket copies not counted).",
            (|counters: &ServerCounters, path: usize| counters.copied_bytes[path]) as fn(&ServerCounters, usize) -> u64,
        ),
        (
            "hydrant_delivered_bytes_total",
            "Object bytes delivered to clients.",
            |counters: &ServerCounters, path: usize| counters.delivered_bytes[path],
        ),
    ] {
        metric(&mut out, name, "counter", help);
        for (path, path_name) in PATH_NAMES.iter().enumerate() {
            let total: u64 = shards
                .iter()
                .map(|(_, counters)| field(counters, path))
                .sum();
            let _ = writeln!(out, "{name}{{path=\"{path_name}\"}} {total}");
        }
    }
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
            "hydrant_local_connections",
            "Same-host connections open now.",
            &LOCAL_CONNECTIONS,
        ),
    ] {
        metric(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
    }
    metric(
        &mut out,
        "hydrant_request_duration_seconds",
        "histogram",
        "Time from a request's arrival to its answer being queued.",
    );
    for opcode in [Opcode::Get, Opcode::Put, Opcode::Head, Opcode::Delete] {
        let index = opcode as usize;
        let mut cumulative = 0;
        for (bucket, bound) in LATENCY_BUCKETS_US
            .iter()
            .map(|&micros| format!("{}", micros as f64 / 1e6))
            .chain(["+Inf".to_string()])
            .enumerate()
        {
            cumulative += shards
                .iter()
                .map(|(_, counters)| counters.latency_buckets[index][bucket])
                .sum::<u64>();
            let _ = writeln!(out, "hydrant_request_duration_seconds_bucket{{operation=\"{opcode:?}\",le=\"{bound}\"}} {cumulative}");
        }
        let sum: u64 = shards
            .iter()
            .map(|(_, counters)| counters.latency_sum_us[index])
            .sum();
        let _ = writeln!(
            out,
            "hydrant_request_duration_seconds_sum{{operation=\"{opcode:?}\"}} {}",
            sum as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "hydrant_request_duration_seconds_count{{operation=\"{opcode:?}\"}} {cumulative}"
        );
    }
    out
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
        let mut text = render(&shards);
        if let Some(origin) = origin {
            text.push_str(&render_origin(&origin));
        }
        if let Some(refused) = refused {
            text.push_str(&render_refused(&refused.await?.0));
        }
        Ok(text)
    }
}

/// Refused writes named in the metrics (all of them: `hydrant uploads`).
const REFUSED_NAMED_MAX: usize = 20;

/// One gauge per refused write, named by labels (at most `REFUSED_NAMED_MAX`).
fn render_refused(refused: &[hydrant_engine::FailedUpload]) -> String {
    let mut out = String::new();
    if refused.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "# HELP hydrant_upload_refused_bytes A write the origin refused for good, kept on NVMe (the first {REFUSED_NAMED_MAX}).\n# TYPE hydrant_upload_refused_bytes gauge"
    );
    for failed in refused {
        let _ = writeln!(
            out,
            "hydrant_upload_refused_bytes{{bucket=\"{}\",key=\"{}\"}} {}",
            label(&failed.bucket),
            label(&failed.key),
            failed.bytes
        );
    }
    out
}

/// A label value as the text format escapes it.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The origin traffic and the dirty budget (engine-wide, not per shard).
pub fn render_origin(origin: &hydrant_engine::OriginStats) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP hydrant_origin_requests_total Requests sent to origins.\n# TYPE hydrant_origin_requests_total counter"
    );
    for (operation, count) in [
        ("get", origin.gets),
        ("head", origin.heads),
        ("put", origin.puts),
        ("list", origin.lists),
        ("delete", origin.deletes),
    ] {
        let _ = writeln!(
            out,
            "hydrant_origin_requests_total{{operation=\"{operation}\"}} {count}"
        );
    }
    let single: [(&str, &str, &str, u64); 8] = [
        (
            "hydrant_origin_errors_total",
            "counter",
            "Origin requests that failed.",
            origin.errors,
        ),
        (
            "hydrant_origin_received_bytes_total",
            "counter",
            "Bytes read from origins.",
            origin.bytes_in,
        ),
        (
            "hydrant_origin_sent_bytes_total",
            "counter",
            "Bytes uploaded to origins.",
            origin.bytes_out,
        ),
        (
            "hydrant_origin_upload_retries_total",
            "counter",
            "Upload attempts that failed and were retried.",
            origin.uploads_retried,
        ),
        (
            "hydrant_dirty_bytes",
            "gauge",
            "Bytes written here and not yet at the origin (budget taken).",
            origin.dirty_bytes,
        ),
        (
            "hydrant_dirty_bytes_max",
            "gauge",
            "The dirty-byte budget.",
            origin.dirty_bytes_max,
        ),
        (
            "hydrant_uploads_refused",
            "gauge",
            "Writes the origin refused for good, kept on NVMe until retried, replaced or deleted.",
            origin.failed_uploads,
        ),
        (
            "hydrant_uploads_refused_bytes",
            "gauge",
            "Bytes of writes the origin refused, apart from the dirty budget.",
            origin.failed_bytes,
        ),
    ];
    for (name, kind, help, value) in single {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    out
}
