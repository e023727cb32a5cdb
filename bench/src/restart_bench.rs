//! How long a shard takes to come back: the engine reopened on a store of many small objects,
//! after a clean stop and after SIGKILL, from its index checkpoint (and the log written after
//! it), against the same restart scanning every region (checkpoints not loaded) and fio reading
//! the bytes that full scan reads (the regions in use, in 1 MiB reads one at a time) from the
//! same file. Each round measures each of them once, alternated.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::block_on;
use hydrant_engine::store::{Counters, ShardStats};
use hydrant_engine::{Engine, EngineConfig};

use crate::engine_bench::{dataset_object_key, fill_shard};
use crate::harness::latency::Latencies;

const MIB: u64 = 1024 * 1024;
/// Objects the killed process writes before it is killed, so that its newest region is open
/// and unsealed, as a crash leaves it.
const TAIL_OBJECTS: usize = 1000;

#[derive(Args)]
pub struct RestartArgs {
    /// Objects of 4 KiB in the store (one shard).
    #[arg(long, default_value_t = 1_000_000)]
    objects: usize,
    /// Restarts of each kind; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Directory for the scratch data file (on the disk to measure).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Internal: open the store, write the tail objects of round N, say so, and wait to be
    /// killed.
    #[arg(long, hide = true)]
    hold_round: Option<usize>,
}

fn engine_error(error: hydrant_engine::Error) -> String {
    error.to_string()
}

fn config_for(path: &Path, bytes: u64) -> EngineConfig {
    let mut config = EngineConfig::new(vec![DeviceConfig::create(path, bytes)]);
    config.shards = Some(1);
    config
}

/// How a restart rebuilds the index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recovery {
    Checkpoint,
    FullScan,
}

impl Recovery {
    fn config(self, path: &Path, bytes: u64) -> EngineConfig {
        let mut config = config_for(path, bytes);
        config.checkpoints.load = self == Recovery::Checkpoint;
        config
    }

    fn name(self) -> &'static str {
        match self {
            Recovery::Checkpoint => "checkpoint",
            Recovery::FullScan => "full scan",
        }
    }
}

fn put_tail(engine: &Engine, round: usize) -> Result<(), String> {
    for index in 0..TAIL_OBJECTS {
        let key = format!("tail-{round}/{index:06}");
        block_on(engine.put("datasets", &key, vec![3u8; 4096])).map_err(engine_error)?;
    }
    Ok(())
}

/// What one restart did.
struct Reopened {
    seconds: f64,
    objects: u64,
    regions_scanned: u64,
    from_checkpoint: bool,
    engine: Engine,
}

/// Open the store and wait until its shard answers.
fn reopen(config: EngineConfig) -> Result<Reopened, String> {
    let started = Instant::now();
    let engine = Engine::open(config).map_err(engine_error)?;
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Reopened {
        seconds,
        objects: stats.iter().map(|shard| shard.objects).sum(),
        regions_scanned: stats
            .iter()
            .map(|shard| shard.counters.regions_scanned)
            .sum(),
        from_checkpoint: stats
            .iter()
            .all(|shard| shard.counters.recovered_from_checkpoint > 0),
        engine,
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|left, right| left.total_cmp(right));
    values[values.len() / 2]
}

pub fn restart(args: RestartArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("restart.hyd");
    // Every object is a 4 KiB header and 4 KiB of data; room for the tails and reclaim's reserve.
    let bytes = ((args.objects + TAIL_OBJECTS * (2 * args.rounds + 1)) as u64 * 8192 * 5 / 4
        + 512 * MIB)
        .div_ceil(64 * MIB)
        * 64
        * MIB;
    if let Some(round) = args.hold_round {
        let engine = Engine::open(config_for(&path, bytes)).map_err(engine_error)?;
        put_tail(&engine, round)?;
        println!("ready");
        std::io::stdout()
            .flush()
            .map_err(|error| error.to_string())?;
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }

    let _ = std::fs::remove_file(&path);
    let objects = args.objects;
    let engine = Engine::open(config_for(&path, bytes)).map_err(engine_error)?;
    let (loaded_seconds, loading_longest_us) = load_while_reading(&engine, objects)?;
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let used_bytes: u64 = stats
        .iter()
        .map(|shard| (shard.regions - shard.regions_free) * shard.region_bytes)
        .sum();
    // Checkpoints taken while the engine runs; the last one's size and pause are reported.
    let (checkpoint_seconds, quiet_longest_us) =
        gets_during_checkpoints(&engine, objects, args.rounds)?;
    println!(
        "longest GET without load/while loading = {:.2}",
        quiet_longest_us / loading_longest_us
    );
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let checkpoint_bytes = shard_counter(&stats, |counters| counters.checkpoint_bytes);
    let pause_us = shard_counter(&stats, |counters| counters.checkpoint_pause_us);
    let closing = Instant::now();
    engine.close();
    let close_seconds = closing.elapsed().as_secs_f64();
    println!(
        "{objects} objects of 4 KiB, one shard, {} MiB of regions in use; loaded in {:.1} s; a checkpoint took {checkpoint_seconds:.2} s (the shard paused {:.1} ms to begin it), close with its checkpoint {close_seconds:.2} s; a checkpoint is {:.1} MiB ({:.0} bytes per object)",
        used_bytes / MIB,
        loaded_seconds,
        pause_us as f64 / 1000.0,
        checkpoint_bytes as f64 / MIB as f64,
        checkpoint_bytes as f64 / objects as f64
    );
    println!("| restart | recovery | round | objects found | log regions scanned | seconds |");
    println!("|---|---|---|---:|---:|---:|");

    let mut expected = objects as u64;
    // Per kind of stop: the seconds of each recovery and of fio, round by round.
    let mut clean: [Vec<f64>; 3] = Default::default();
    let mut killed: [Vec<f64>; 3] = Default::default();
    let mut kills = 0;
    for round in 1..=args.rounds {
        // Alternate the peer and the restarts, so that a drifting disk favours none.
        let measure = |after: &str, recovery: Recovery, expected: u64| -> Result<f64, String> {
            let reopened = reopen(recovery.config(&path, bytes))?;
            reopened.engine.close();
            if reopened.objects != expected {
                return Err(format!(
                    "after {after} ({}), {} objects came back, not {expected}",
                    recovery.name(),
                    reopened.objects
                ));
            }
            if reopened.from_checkpoint != (recovery == Recovery::Checkpoint) {
                return Err(format!(
                    "after {after}, a restart meant to use {} did not",
                    recovery.name()
                ));
            }
            println!(
                "| after {after} | {} | {round} | {} | {} | {:.2} |",
                recovery.name(),
                reopened.objects,
                reopened.regions_scanned,
                reopened.seconds
            );
            Ok(reopened.seconds)
        };
        let fio = |after: &str| -> Result<f64, String> {
            let seconds = crate::fio::read_once_seconds(&path, used_bytes, "1m", 1)?;
            println!(
                "| after {after} | fio reading the regions in use | {round} | | | {seconds:.2} |"
            );
            Ok(seconds)
        };
        clean[2].push(fio("a clean stop")?);
        clean[0].push(measure("a clean stop", Recovery::Checkpoint, expected)?);
        clean[1].push(measure("a clean stop", Recovery::FullScan, expected)?);

        for recovery in [Recovery::Checkpoint, Recovery::FullScan] {
            kills += 1;
            expected += TAIL_OBJECTS as u64;
            kill_after_tail(&args, kills)?;
            let seconds = measure("SIGKILL", recovery, expected)?;
            killed[usize::from(recovery == Recovery::FullScan)].push(seconds);
        }
        killed[2].push(fio("SIGKILL")?);
    }
    let _ = std::fs::remove_file(&path);
    for (after, seconds) in [("a clean stop", &mut clean), ("SIGKILL", &mut killed)] {
        let [checkpoint, full_scan, fio] = seconds;
        let (checkpoint, full_scan, fio) = (median(checkpoint), median(full_scan), median(fio));
        println!(
            "median seconds (restart after {after}): checkpoint {checkpoint:.2}, full scan {full_scan:.2}, fio {fio:.2}"
        );
        println!(
            "median full-scan/checkpoint (restart after {after}) = {:.2}",
            full_scan / checkpoint
        );
        println!(
            "median fio/hydrant (restart after {after}) = {:.2}",
            fio / checkpoint
        );
    }
    Ok(())
}

/// GETs of random objects among the first `objects`, one at a time, until `until`; returns
/// their latencies and count. With `must_find`, a missing object is an error.
fn random_gets(
    engine: &Engine,
    objects: usize,
    until: &dyn Fn() -> bool,
    seed: u64,
    must_find: bool,
) -> Result<(Latencies, u64), String> {
    let mut latencies = Latencies::new();
    let mut random = seed;
    let mut gets = 0;
    while !until() {
        // SplitMix64 steps: random keys, the same for the same seed.
        random = random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = random;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let index = ((mixed ^ (mixed >> 31)) % objects as u64) as usize;
        let key = dataset_object_key(index);
        let started = Instant::now();
        let found = block_on(engine.get("datasets", key.key(), None)).map_err(engine_error)?;
        latencies.record(started.elapsed());
        if must_find && found.is_none() {
            return Err(format!("object {index} was not found"));
        }
        gets += 1;
    }
    Ok((latencies, gets))
}

/// Load `objects` objects into shard 0 while one reader GETs random keys among them (found or
/// not yet): the index grows from empty meanwhile, so its growth's longest stall of the shard
/// shows as the longest GET. Returns the seconds the load took and the longest GET, in
/// microseconds.
fn load_while_reading(engine: &Engine, objects: usize) -> Result<(f64, f64), String> {
    use std::sync::atomic::{AtomicBool, Ordering};

    let loaded = AtomicBool::new(false);
    let loading = Instant::now();
    let (filled, read) = std::thread::scope(|scope| {
        let filler = scope.spawn(|| {
            let filled = block_on(engine.on_shard(0, move |cache| {
                fill_shard(cache.store().clone(), objects, dataset_object_key, |_| {
                    vec![7u8; 4096]
                })
            }));
            loaded.store(true, Ordering::Release);
            filled
        });
        let read = random_gets(
            engine,
            objects,
            &|| loaded.load(Ordering::Acquire),
            7,
            false,
        );
        loaded.store(true, Ordering::Release);
        (filler.join(), read)
    });
    let seconds = loading.elapsed().as_secs_f64();
    match filled {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(engine_error(error)),
        Err(_) => return Err("the loading thread panicked".into()),
    }
    let (latencies, gets) = read?;
    let summary = latencies.summary();
    println!("| GETs, one reader, while {objects} objects are loaded | GETs | p50 us | p99 us | p99.9 us | max us |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| as the index grows from empty | {gets} | {:.0} | {:.0} | {:.0} | {:.0} |",
        summary.p50, summary.p99, summary.p99_9, summary.max
    );
    println!("longest GET while loading = {:.0} us", summary.max);
    Ok((seconds, summary.max))
}

/// A counter of the store's one shard.
fn shard_counter(stats: &[ShardStats], counter: impl Fn(&Counters) -> u64) -> u64 {
    stats.iter().map(|shard| counter(&shard.counters)).sum()
}

/// GETs of random objects from one reader while the shard takes a checkpoint, against the same
/// reader for as long right after without one, `rounds` times alternated: what a checkpoint costs
/// the readers (its longest stall shows as the max). Returns the seconds the last checkpoint
/// took and the median longest GET without one, in microseconds.
fn gets_during_checkpoints(
    engine: &Engine,
    objects: usize,
    rounds: usize,
) -> Result<(f64, f64), String> {
    use std::sync::atomic::{AtomicBool, Ordering};

    let reading =
        |until: &dyn Fn() -> bool, seed: u64| random_gets(engine, objects, until, seed, true);
    println!("| GETs, one reader | round | GETs | p50 us | p99 us | p99.9 us | max us | shard's pause ms | longest step ms |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut maxima: [Vec<f64>; 2] = Default::default();
    let mut last_seconds = 0.0;
    for round in 1..=rounds {
        let done = AtomicBool::new(false);
        let started = Instant::now();
        let (taken, during) = std::thread::scope(|scope| {
            let checkpoint = scope.spawn(|| {
                let taken = block_on(
                    engine.on_shard(0, |cache| async move { cache.store().checkpoint().await }),
                );
                done.store(true, Ordering::Release);
                taken
            });
            let during = reading(&|| done.load(Ordering::Acquire), round as u64);
            done.store(true, Ordering::Release);
            (checkpoint.join(), during)
        });
        let lasted = started.elapsed();
        match taken {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Err("the checkpoint found no room".into()),
            Ok(Err(error)) => return Err(engine_error(error)),
            Err(_) => return Err("the checkpoint's thread panicked".into()),
        }
        let (during, during_gets) = during?;
        let stats = block_on(engine.stats()).map_err(engine_error)?;
        let pause_us = shard_counter(&stats, |counters| counters.checkpoint_pause_us);
        let step_us = shard_counter(&stats, |counters| counters.checkpoint_step_max_us);
        last_seconds = lasted.as_secs_f64();
        let quiet_until = Instant::now() + lasted;
        let (quiet, quiet_gets) = reading(&|| Instant::now() >= quiet_until, 1000 + round as u64)?;
        for (what, latencies, gets, pause) in [
            (
                "while a checkpoint is taken",
                &during,
                during_gets,
                Some((pause_us, step_us)),
            ),
            ("as long, without one", &quiet, quiet_gets, None),
        ] {
            let summary = latencies.summary();
            maxima[usize::from(pause.is_none())].push(summary.max);
            println!(
                "| {what} | {round} | {gets} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                summary.p50,
                summary.p99,
                summary.p99_9,
                summary.max,
                pause.map_or(" | ".to_string(), |(pause, step)| format!(
                    "{:.1} | {:.1}",
                    pause as f64 / 1000.0,
                    step as f64 / 1000.0
                ))
            );
        }
    }
    let [during, quiet] = &mut maxima;
    let (during, quiet) = (median(during), median(quiet));
    println!(
        "median longest GET: {during:.0} us while a checkpoint is taken, {quiet:.0} us without one"
    );
    println!(
        "median longest GET without/with a checkpoint = {:.2}",
        quiet / during
    );
    Ok((last_seconds, quiet))
}

/// Start a process that opens the store, writes round `kill`'s tail objects (its newest region
/// open and unsealed) and waits; SIGKILL it.
fn kill_after_tail(args: &RestartArgs, kill: usize) -> Result<(), String> {
    let mut child = Command::new(std::env::current_exe().map_err(|error| error.to_string())?)
        .args(["restart", "--hold-round", &kill.to_string()])
        .arg("--dir")
        .arg(&args.dir)
        .arg("--objects")
        .arg(args.objects.to_string())
        .arg("--rounds")
        .arg(args.rounds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot start the process to kill: {error}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .map_err(|error| error.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(format!("the process to kill said {line:?}"));
    }
    // SIGKILL: no close, no seal; the newest region is open.
    child.kill().map_err(|error| error.to_string())?;
    let _ = child.wait();
    Ok(())
}
