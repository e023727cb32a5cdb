//! How long a shard takes to come back: the engine reopened on a store of many small objects,
//! after a clean stop and after SIGKILL, against fio reading the bytes that recovery reads (the
//! regions in use, in 1 MiB reads one at a time, as the scan reads them) from the same file.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::rt::block_on;
use hydrant_engine::{Engine, EngineConfig};

use crate::engine_bench::{dataset_object_key, fill_shard};

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

fn put_tail(engine: &Engine, round: usize) -> Result<(), String> {
    for index in 0..TAIL_OBJECTS {
        let key = format!("tail-{round}/{index:06}");
        block_on(engine.put("datasets", &key, vec![3u8; 4096])).map_err(engine_error)?;
    }
    Ok(())
}

/// Open the store and wait until its shard answers; the seconds it took and the objects found.
fn reopen(config: EngineConfig) -> Result<(f64, u64, Engine), String> {
    let started = Instant::now();
    let engine = Engine::open(config).map_err(engine_error)?;
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let seconds = started.elapsed().as_secs_f64();
    Ok((
        seconds,
        stats.iter().map(|shard| shard.objects).sum(),
        engine,
    ))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|left, right| left.total_cmp(right));
    values[values.len() / 2]
}

pub fn restart(args: RestartArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("restart.hyd");
    // Every object is a 4 KiB header and 4 KiB of data; room for the tails and reclaim's reserve.
    let bytes = ((args.objects + TAIL_OBJECTS * (args.rounds + 1)) as u64 * 8192 * 5 / 4
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
    let loading = Instant::now();
    let engine = Engine::open(config_for(&path, bytes)).map_err(engine_error)?;
    block_on(engine.on_shard(0, move |cache| {
        fill_shard(cache.store().clone(), objects, dataset_object_key, |_| {
            vec![7u8; 4096]
        })
    }))
    .map_err(engine_error)?;
    let stats = block_on(engine.stats()).map_err(engine_error)?;
    let used_bytes: u64 = stats
        .iter()
        .map(|shard| (shard.regions - shard.regions_free) * shard.region_bytes)
        .sum();
    engine.close();
    println!(
        "{objects} objects of 4 KiB, one shard, {} MiB of regions in use; loaded in {:.1} s",
        used_bytes / MIB,
        loading.elapsed().as_secs_f64()
    );
    println!("| restart | round | objects found | hydrant s | fio reading the regions in use, s | fio/hydrant |");
    println!("|---|---|---:|---:|---:|---:|");

    let mut expected = objects as u64;
    let (mut clean, mut killed) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        // Alternate the peer and the restart, so that a drifting disk favours neither.
        let measure = |after: &str, expected: u64| -> Result<f64, String> {
            let peer = crate::fio::read_once_seconds(&path, used_bytes, "1m", 1)?;
            let (seconds, found, engine) = reopen(config_for(&path, bytes))?;
            engine.close();
            if found != expected {
                return Err(format!(
                    "after {after}, {found} objects came back, not {expected}"
                ));
            }
            println!(
                "| after {after} | {round} | {found} | {seconds:.2} | {peer:.2} | {:.2} |",
                peer / seconds
            );
            Ok(peer / seconds)
        };
        clean.push(measure("a clean stop", expected)?);

        let mut child = Command::new(std::env::current_exe().map_err(|error| error.to_string())?)
            .args(["restart", "--hold-round", &round.to_string()])
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
        expected += TAIL_OBJECTS as u64;
        killed.push(measure("SIGKILL", expected)?);
    }
    let _ = std::fs::remove_file(&path);
    println!(
        "median fio/hydrant (restart after a clean stop) = {:.2}",
        median(&mut clean)
    );
    println!(
        "median fio/hydrant (restart after SIGKILL) = {:.2}",
        median(&mut killed)
    );
    Ok(())
}
