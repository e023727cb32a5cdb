//! The engine against fio on the same file, the index's memory cost, and the demo.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Args;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::{block_on, spawn};
use hydrant_engine::store::{ObjectKey, Store};
use hydrant_engine::{Engine, EngineConfig, FormatPolicy};

use crate::fio;

const MIB: u64 = 1024 * 1024;
const SMALL_OBJECT_BYTES: usize = 4096;
const LARGE_OBJECT_BYTES: usize = 1024 * 1024;
/// Puts in flight while filling the store.
const FILL_DEPTH: usize = 32;

#[derive(Args)]
pub struct EngineArgs {
    /// The file to benchmark on (overwritten). Put it on the device you want to measure.
    #[arg(long)]
    path: PathBuf,
    /// Size of the file.
    #[arg(long, default_value_t = 2048)]
    size_mib: u64,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds; each runs fio and the engine once per workload, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Requests in flight for 4 KiB random reads (fio iodepth and engine concurrency alike).
    #[arg(long, default_value_t = 32)]
    random_depth: u32,
    /// Requests in flight for 1 MiB sequential reads.
    #[arg(long, default_value_t = 8)]
    sequential_depth: u32,
    /// Core to pin both the engine's shard and fio to, so that both get the same CPU budget.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
}

fn small_key(index: usize) -> ObjectKey {
    ObjectKey::new("bench", &format!("small/{index:09}")).expect("valid key")
}

fn large_key(index: usize) -> ObjectKey {
    ObjectKey::new("bench", &format!("large/{index:06}")).expect("valid key")
}

fn object_bytes(index: usize, len: usize) -> Vec<u8> {
    let stamp = (index as u64).to_le_bytes();
    stamp.iter().copied().cycle().take(len).collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|left, right| left.total_cmp(right));
    values[values.len() / 2]
}

/// Put `count` objects, `key(index)` holding `value(index)`, FILL_DEPTH at a time.
pub(crate) async fn fill_shard(
    store: Rc<Store>,
    count: usize,
    key: fn(usize) -> ObjectKey,
    value: impl Fn(usize) -> Vec<u8> + Clone + 'static,
) -> hydrant_engine::Result<()> {
    let next = Rc::new(Cell::new(0usize));
    let workers: Vec<_> = (0..FILL_DEPTH)
        .map(|_| {
            let store = store.clone();
            let next = next.clone();
            let value = value.clone();
            spawn(async move {
                loop {
                    let index = next.get();
                    if index >= count {
                        return Ok(());
                    }
                    next.set(index + 1);
                    store.put(key(index), &value(index), false).await?;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await?;
    }
    Ok(())
}

/// Gets of random objects among `count` (`key(index)`, each `size` bytes), `depth` at a time,
/// for `duration`; returns gets per second.
async fn random_reads(
    store: Rc<Store>,
    (count, key, size): (usize, fn(usize) -> ObjectKey, usize),
    depth: u32,
    duration: Duration,
) -> hydrant_engine::Result<f64> {
    let keys: Rc<Vec<ObjectKey>> = Rc::new((0..count).map(key).collect());
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..depth)
        .map(|worker| {
            let store = store.clone();
            let keys = keys.clone();
            spawn(async move {
                let mut state = 0x9E37_79B9_7F4A_7C15u64
                    ^ (worker as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D);
                let mut done = 0u64;
                while Instant::now() < deadline {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let key = &keys[(state % keys.len() as u64) as usize];
                    let read = store.get(key, None).await?.ok_or_else(missing)?;
                    assert_eq!(read.len(), size);
                    done += 1;
                }
                Ok::<u64, hydrant_engine::Error>(done)
            })
        })
        .collect();
    let mut total = 0;
    for worker in workers {
        total += worker.await?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Gets of the large objects in key (and disk) order, `depth` at a time; returns bytes/s.
async fn sequential_reads(
    store: Rc<Store>,
    count: usize,
    depth: u32,
    duration: Duration,
) -> hydrant_engine::Result<f64> {
    let keys: Rc<Vec<ObjectKey>> = Rc::new((0..count).map(large_key).collect());
    let next = Rc::new(Cell::new(0usize));
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..depth)
        .map(|_| {
            let store = store.clone();
            let keys = keys.clone();
            let next = next.clone();
            spawn(async move {
                let mut bytes = 0u64;
                while Instant::now() < deadline {
                    let index = next.get();
                    next.set((index + 1) % keys.len());
                    let read = store.get(&keys[index], None).await?.ok_or_else(missing)?;
                    assert_eq!(read.len(), LARGE_OBJECT_BYTES);
                    bytes += read.len() as u64;
                }
                Ok::<u64, hydrant_engine::Error>(bytes)
            })
        })
        .collect();
    let mut total = 0;
    for worker in workers {
        total += worker.await?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

fn missing() -> hydrant_engine::Error {
    hydrant_engine::Error::new(
        hydrant_engine::ErrorKind::InvalidConfig,
        "a benchmark object was evicted: the file is too small for the data set",
    )
}

fn engine_error(error: hydrant_engine::Error) -> String {
    error.to_string()
}

pub fn engine(args: EngineArgs) -> Result<(), String> {
    let bytes = args.size_mib * MIB;
    if bytes < 512 * MIB {
        return Err("--size-mib must be at least 512".into());
    }
    let _ = std::fs::remove_file(&args.path);
    if let Some(parent) = args
        .path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|error| error.to_string())?;
    }
    println!(
        "preparing {}: {} MiB written sequentially by fio, then formatted",
        args.path.display(),
        args.size_mib
    );
    fio::fill(&args.path, bytes)?;

    let mut config = EngineConfig::new(vec![DeviceConfig::new(&args.path)]);
    config.shards = Some(1);
    config.format = FormatPolicy::Always;
    config.arena_bytes = 128 * MIB as usize;
    config.io_depth_max = 64;
    // Room for the large reads' depth (1 MiB + a 4 KiB header each), so that the engine and fio
    // are compared at the same depth.
    config.io_bytes_in_flight_max = config
        .io_bytes_in_flight_max
        .max(u64::from(args.sequential_depth) * (MIB + 4096));
    config.cpus = Some(vec![args.cpu]);
    let engine = Engine::open(config).map_err(engine_error)?;
    // Small objects take 8 KiB each on disk (header + data), large ones 1 MiB + 4 KiB: fill
    // about 40% of the usable space with each.
    // Usable space leaves out the superblocks and the regions kept free for reclaim (three
    // 64 MiB regions, with room to spare), so that nothing stored is evicted.
    let usable = bytes - MIB - 3 * 64 * MIB;
    let small_count = (usable * 4 / 10 / 8192) as usize;
    let large_count = (usable * 4 / 10 / (MIB + 4096)) as usize;
    let started = Instant::now();
    block_on(engine.on_shard(0, move |store| {
        fill_shard(store.store().clone(), small_count, small_key, |index| {
            object_bytes(index, SMALL_OBJECT_BYTES)
        })
    }))
    .map_err(engine_error)?;
    block_on(engine.on_shard(0, move |store| {
        fill_shard(store.store().clone(), large_count, large_key, |index| {
            object_bytes(index, LARGE_OBJECT_BYTES)
        })
    }))
    .map_err(engine_error)?;
    println!(
        "stored {small_count} objects of 4 KiB and {large_count} of 1 MiB in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let duration = Duration::from_secs(args.seconds);
    let (mut fio_random, mut engine_random, mut fio_sequential, mut engine_sequential) =
        (vec![], vec![], vec![], vec![]);
    println!();
    println!(
        "| round | fio 4k randread IOPS | engine 4k get/s | ratio | fio 1m read MB/s | engine 1m get MB/s | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut random_ratios, mut sequential_ratios) = (vec![], vec![]);
    for round in 1..=args.rounds {
        let fio_r = fio::run(
            &args.path,
            "randread4k",
            "randread",
            "4k",
            args.random_depth,
            args.seconds,
            Some(args.cpu),
        )?;
        let depth = args.random_depth;
        let engine_r = block_on(engine.on_shard(0, move |store| {
            random_reads(
                store.store().clone(),
                (small_count, small_key, SMALL_OBJECT_BYTES),
                depth,
                duration,
            )
        }))
        .map_err(engine_error)?;
        let fio_s = fio::run(
            &args.path,
            "seqread1m",
            "read",
            "1m",
            args.sequential_depth,
            args.seconds,
            Some(args.cpu),
        )?;
        let depth = args.sequential_depth;
        let engine_s = block_on(engine.on_shard(0, move |store| {
            sequential_reads(store.store().clone(), large_count, depth, duration)
        }))
        .map_err(engine_error)?;
        // Each round measures fio and the engine back to back, so the ratio within a round is
        // the least disturbed by the machine's drift.
        let (random_ratio, sequential_ratio) =
            (engine_r / fio_r.iops, engine_s / fio_s.bytes_per_second);
        println!(
            "| {round} | {:.0} | {:.0} | {random_ratio:.2} | {:.0} | {:.0} | {sequential_ratio:.2} |",
            fio_r.iops,
            engine_r,
            fio_s.bytes_per_second / 1e6,
            engine_s / 1e6
        );
        random_ratios.push(random_ratio);
        sequential_ratios.push(sequential_ratio);
        fio_random.push(fio_r.iops);
        engine_random.push(engine_r);
        fio_sequential.push(fio_s.bytes_per_second);
        engine_sequential.push(engine_s);
    }
    let (fio_r, engine_r) = (median(&mut fio_random), median(&mut engine_random));
    let (fio_s, engine_s) = (median(&mut fio_sequential), median(&mut engine_sequential));
    let (random_ratio, sequential_ratio) =
        (median(&mut random_ratios), median(&mut sequential_ratios));
    println!(
        "| median | {fio_r:.0} | {engine_r:.0} | {random_ratio:.2} | {:.0} | {:.0} | {sequential_ratio:.2} |",
        fio_s / 1e6,
        engine_s / 1e6
    );
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    println!();
    println!(
        "engine: 1 shard on core {}, arena {} MiB locked={} registered={}, ring DEFER_TASKRUN={}, checksum errors {}; fio pinned to the same core",
        args.cpu,
        stats[0].arena.bytes as u64 / MIB,
        stats[0].arena.locked,
        stats[0].arena.registered,
        stats[0].ring_defer_taskrun,
        stats[0].counters.checksum_errors
    );
    engine.close();
    // The ratios are the medians of the per-round ratios.
    println!("engine/fio randread4k={random_ratio:.2} seqread1m={sequential_ratio:.2}");
    Ok(())
}

#[derive(Args)]
pub struct IndexMemoryArgs {
    /// Directory for the scratch data file.
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Objects to index.
    #[arg(long, default_value_t = 200_000)]
    objects: usize,
}

#[derive(Args)]
pub struct SpaceArgs {
    /// Directory for the scratch data file.
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Object sizes, in bytes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,1024,4096,65536,1048576"
    )]
    sizes: Vec<usize>,
    /// Bytes of objects stored per size (at least 1,000 objects, at most 200,000).
    #[arg(long, default_value_t = 256 * MIB)]
    bytes: u64,
    /// Seconds of random GETs per size.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
}

/// NVMe bytes per stored byte, and PUT and GET rates, by object size: one shard on a fresh
/// data file per size, objects with 39-byte keys PUT 32 at a time, then GET at random 32 at a
/// time from the device (the store itself, no DRAM tier in front).
pub fn space(args: SpaceArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("space.hyd");
    println!("| object bytes | objects | stored bytes | log bytes | NVMe bytes per stored byte | PUTs/s | GETs/s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &size in &args.sizes {
        let objects = (args.bytes / size.max(1) as u64).clamp(1000, 200_000) as usize;
        let _ = std::fs::remove_file(&path);
        // Today's entries: a 4 KiB header and the data padded to 4 KiB; room for reclaim's
        // reserve beside them.
        let entry = 4096 + (size as u64).div_ceil(4096) * 4096;
        let bytes = (objects as u64 * entry * 5 / 4 + 512 * MIB).div_ceil(64 * MIB) * 64 * MIB;
        let mut config = EngineConfig::new(vec![DeviceConfig::create(&path, bytes)]);
        config.shards = Some(1);
        let engine = Engine::open(config).map_err(engine_error)?;
        let log_before = block_on(engine.stats()).map_err(engine_error)?[0]
            .counters
            .log_bytes;
        let started = Instant::now();
        block_on(engine.on_shard(0, move |store| {
            fill_shard(
                store.store().clone(),
                objects,
                dataset_object_key,
                move |index| object_bytes(index, size),
            )
        }))
        .map_err(engine_error)?;
        let puts_per_second = objects as f64 / started.elapsed().as_secs_f64();
        let stats = block_on(engine.stats()).map_err(engine_error)?;
        let log_bytes = stats[0].counters.log_bytes - log_before;
        let stored = stats[0].object_bytes;
        let duration = Duration::from_secs(args.seconds);
        let gets_per_second = block_on(engine.on_shard(0, move |store| {
            random_reads(
                store.store().clone(),
                (objects, dataset_object_key, size),
                FILL_DEPTH as u32,
                duration,
            )
        }))
        .map_err(engine_error)?;
        engine.close();
        let _ = std::fs::remove_file(&path);
        println!(
            "| {size} | {objects} | {stored} | {log_bytes} | {:.2} | {puts_per_second:.0} | {gets_per_second:.0} |",
            log_bytes as f64 / stored as f64
        );
    }
    Ok(())
}

pub(crate) fn dataset_object_key(index: usize) -> ObjectKey {
    ObjectKey::new("datasets", &dataset_key(index)).expect("valid key")
}

fn dataset_key(index: usize) -> String {
    // A typical dataset key: 39 bytes.
    format!("train/shard-{:05}/sample-{index:010}.jpg", index / 1000)
}

pub fn index_memory(args: IndexMemoryArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("index-memory.hyd");
    let _ = std::fs::remove_file(&path);
    // Every object is one 4 KiB header plus 4 KiB of data; leave room for reclaim's reserve.
    let bytes = (args.objects as u64 * 8192 * 5 / 4 + 512 * MIB).div_ceil(64 * MIB) * 64 * MIB;
    let mut config = EngineConfig::new(vec![DeviceConfig::create(&path, bytes)]);
    config.shards = Some(1);
    let engine = Engine::open(config).map_err(engine_error)?;
    let objects = args.objects;
    // Warm up the shard's allocations (task slots, channels) before counting.
    block_on(engine.put("warm", "up", vec![1; 16])).map_err(engine_error)?;
    block_on(engine.delete("warm", "up")).map_err(engine_error)?;
    crate::alloc_counter::start_counting();
    let before = crate::alloc_counter::live_bytes();
    block_on(engine.on_shard(0, move |store| {
        fill_shard(store.store().clone(), objects, dataset_object_key, |_| {
            vec![7u8; 4096]
        })
    }))
    .map_err(engine_error)?;
    let after = crate::alloc_counter::live_bytes();
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    engine.close();
    let _ = std::fs::remove_file(&path);
    let per_object = (after - before) as f64 / stats[0].objects as f64;
    println!("| objects | key bytes | heap bytes after - before | bytes per object |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {} | {} | {per_object:.1} |",
        stats[0].objects,
        dataset_key(0).len(),
        after - before
    );
    Ok(())
}

pub fn demo(path: &Path) -> Result<(), String> {
    let mut config = EngineConfig::new(vec![DeviceConfig::create(path, 1024 * MIB)]);
    config.arena_bytes = 32 * MIB as usize;
    // A 1 GiB demo file holds 15 regions of 64 MiB; each shard needs three.
    if !path.exists() {
        let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
        config.shards = Some(cpus.min(4));
    }
    let engine = Engine::open(config).map_err(engine_error)?;
    println!(
        "hydrant engine on {} ({} shards)",
        path.display(),
        engine.shard_count()
    );
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let before: u64 = stats.iter().map(|shard| shard.objects).sum();
    println!("objects already stored: {before}");
    for index in 0..3 {
        let key = format!("hello-{index}.txt");
        let body = format!("hello from hydrant, object {index}\n").into_bytes();
        let meta = block_on(engine.put("demo", &key, body)).map_err(engine_error)?;
        let (_, data) = block_on(engine.get("demo", &key, None))
            .map_err(engine_error)?
            .ok_or("just stored, yet missing")?;
        print!(
            "put and got demo/{key} ({} bytes, version {}): {}",
            meta.bytes,
            meta.seq,
            String::from_utf8_lossy(&data)
        );
    }
    let listed = block_on(engine.list("demo", "hello-", None, 100)).map_err(engine_error)?;
    println!("listed {} objects under demo/hello-", listed.len());
    engine.close();
    let engine =
        Engine::open(EngineConfig::new(vec![DeviceConfig::new(path)])).map_err(engine_error)?;
    let found = block_on(engine.get("demo", "hello-0.txt", None)).map_err(engine_error)?;
    println!(
        "reopened: demo/hello-0.txt is {}",
        if found.is_some() {
            "still there"
        } else {
            "missing"
        }
    );
    Ok(())
}
