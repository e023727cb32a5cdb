//! hydrant-bench: hydrant's benchmark harness. Every figure it prints is measured side by side
//! with its peer in the same run, because the machines it runs on are shared and noisy.
//!
//! - `engine`: the engine's 4 KiB random reads and 1 MiB sequential reads against fio on the
//!   same file, alternating rounds, medians and ratios.
//! - `index-memory`: the DRAM the index costs per stored object, counted by the allocator.
//! - `local`: the same-host path vs TCP on loopback vs fio, 1 MiB reads, CPU per GiB.
//! - `origin`: hydrant in front of an S3 origin at S3's latency vs the origin used directly.
//! - `demo`: the engine on its embedded defaults, for a first look.
//! - `trace`: eviction policies replaying a cache trace, miss ratios side by side.
//! - `policy-ops`: eviction policies' operations per second on one core.
//! - `get`, `put`, `mixed`, `shards`, `checkpoint`: workloads against running servers,
//!   a table and a versioned JSON report each; `report` compares such reports in a table and plots.
//! - `serve`: a hydrant server with no origin for those workloads, until Ctrl-C.
//! - `fio-report`: the JSON reports of `fio-profiles/run.sh` as one table.

mod alloc_counter;
mod engine_bench;
mod fio;
mod fio_report;
mod harness;
mod local_bench;
mod memcached;
mod nginx_bench;
mod origin_bench;
mod peers;
mod plot;
mod policy_bench;
mod python_bench;
mod redis;
mod restart_bench;
mod s3_reader_bench;
mod script;
mod serve;
mod server_bench;
mod torch_bench;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: alloc_counter::CountingAllocator = alloc_counter::CountingAllocator;

#[derive(Parser)]
#[command(
    name = "hydrant-bench",
    about = "Benchmarks for hydrant, each measured against its peer in the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Engine vs fio on the same file: 4 KiB random reads at queue depth 32, 1 MiB sequential
    /// reads. The file is overwritten.
    Engine(engine_bench::EngineArgs),
    /// DRAM bytes the index costs per stored object.
    IndexMemory(engine_bench::IndexMemoryArgs),
    /// NVMe bytes per stored byte, and PUT and GET rates, for objects of 100 B to 1 MiB.
    Space(engine_bench::SpaceArgs),
    /// A shard's restart on a store of many small objects, after a clean stop and after SIGKILL,
    /// vs fio reading the regions in use from the same file.
    Restart(restart_bench::RestartArgs),
    /// hydrant-server against memcached on loopback: GETs of 4 KiB values.
    Server(server_bench::ServerArgs),
    /// hydrant-server's S3 endpoint and native protocol against nginx, GETs of 1 MiB and 4 KiB:
    /// NVMe tier vs directio + aio threads, DRAM tier vs the page cache.
    Nginx(nginx_bench::NginxArgs),
    /// A boto3 reader of a dataset through hydrant's S3 endpoint (warm) vs the same reader
    /// straight from a slow S3 origin.
    S3Reader(s3_reader_bench::S3ReaderArgs),
    /// The Python package (hydrant.Client, 16 threads) vs the Rust client vs boto3 through the
    /// S3 endpoint: GETs of 1 MiB and 4 KiB on the same server and objects.
    Python(python_bench::PythonArgs),
    /// A PyTorch DataLoader over hydrant (cold, warm) vs s3torchconnector reading a slow S3
    /// origin directly: samples/s and simulated accelerator utilisation.
    Torch(torch_bench::TorchArgs),
    /// The same-host path (shared region over a Unix socket) vs TCP on loopback vs fio on the
    /// same file: 1 MiB reads, throughput and CPU seconds per GiB.
    Local(local_bench::LocalArgs),
    /// hydrant in front of a slow S3 origin vs the origin directly: a checkpoint burst in
    /// write-back, and a dataset read by several loaders, cold and warm.
    Origin(origin_bench::OriginArgs),
    /// Replay a cache trace through each eviction policy at each size: miss ratios side by side.
    Trace(policy_bench::TraceArgs),
    /// Eviction policies' hits and misses per second on one core.
    PolicyOps(policy_bench::PolicyOpsArgs),
    /// GETs against running servers, keys uniform or Zipf (loaded first unless --no-load).
    Get(harness::key_value::KeyValueArgs),
    /// PUTs against running servers, keys uniform or Zipf.
    Put(harness::key_value::KeyValueArgs),
    /// GETs and PUTs (--read-fraction) against running servers.
    Mixed(harness::key_value::MixedArgs),
    /// Simulated accelerators streaming shard objects; throughput and accelerator utilisation
    /// against MLPerf Storage's 90% bar.
    Shards(harness::shards::ShardsArgs),
    /// A burst of large PUTs by several writers, then FLUSH: time to acknowledged and to flushed.
    Checkpoint(harness::checkpoint::CheckpointArgs),
    /// A hydrant server with no origin on a scratch file, until Ctrl-C, for the workloads.
    Serve(serve::ServeArgs),
    /// Compare workload runs from their --json reports: a table, and plots with --out.
    Report(harness::report::ReportArgs),
    /// The JSON reports of fio-profiles/run.sh as one markdown table.
    FioReport(fio_report::FioReportArgs),
    /// Store, read and reopen a few objects on the embedded defaults (./hydrant-data).
    Demo {
        /// The data file (created with 1 GiB if absent).
        #[arg(long, default_value = "hydrant-data/data.hyd")]
        path: PathBuf,
    },
}

/// Run a workload with Ctrl-C caught, then print its table and write its JSON.
fn workload(
    common: &harness::CommonArgs,
    run: impl FnOnce() -> Result<harness::schema::RunReport, String>,
) -> Result<(), String> {
    harness::interrupt::install();
    let report = run()?;
    harness::publish(&report, common.json.as_ref())
}

/// A key-value workload against hydrant, then against each peer asked for (`--peer-memcached`,
/// `--peer-redis`): each run's table and report, and the ratios of hydrant's figures to each
/// peer's.
fn key_value_workload(
    args: &harness::key_value::KeyValueArgs,
    run: impl FnOnce() -> Result<harness::schema::RunReport, String>,
    on_peer: impl Fn(harness::key_value::Peer) -> Result<Option<harness::schema::RunReport>, String>,
) -> Result<(), String> {
    harness::interrupt::install();
    let hydrant = run()?;
    harness::publish(&hydrant, args.common.json.as_ref())?;
    let mut ratios = Vec::new();
    for peer in harness::key_value::Peer::ALL {
        if harness::interrupt::interrupted() {
            break;
        }
        if let Some(report) = on_peer(peer)? {
            println!("\nthe same workload against {}:", peer.name());
            harness::publish(&report, harness::key_value::peer_json(args, peer).as_ref())?;
            ratios.push(harness::key_value::ratio_line(
                &hydrant,
                &report,
                peer.name(),
            ));
        }
    }
    if !ratios.is_empty() {
        println!();
        for line in ratios {
            println!("{line}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Engine(args) => engine_bench::engine(args),
        Command::IndexMemory(args) => engine_bench::index_memory(args),
        Command::Space(args) => engine_bench::space(args),
        Command::Restart(args) => restart_bench::restart(args),
        Command::Server(args) => server_bench::server(args),
        Command::Origin(args) => origin_bench::origin(args),
        Command::Nginx(args) => nginx_bench::nginx(args),
        Command::S3Reader(args) => s3_reader_bench::s3_reader(args),
        Command::Python(args) => python_bench::python(args),
        Command::Torch(args) => torch_bench::torch(args),
        Command::Local(args) => local_bench::local(args),
        Command::Demo { path } => engine_bench::demo(&path),
        Command::Trace(args) => policy_bench::trace(args),
        Command::PolicyOps(args) => policy_bench::policy_ops(args),
        Command::Get(args) => key_value_workload(
            &args,
            || harness::key_value::get(&args),
            |peer| harness::key_value::get_on_peer(&args, peer),
        ),
        Command::Put(args) => key_value_workload(
            &args,
            || harness::key_value::put(&args),
            |peer| harness::key_value::put_on_peer(&args, peer),
        ),
        Command::Mixed(args) => key_value_workload(
            &args.key_value,
            || harness::key_value::mixed(&args),
            |peer| harness::key_value::mixed_on_peer(&args, peer),
        ),
        Command::Shards(args) if args.origin.origin_s3.is_some() => {
            harness::interrupt::install();
            harness::shards_origin::shards_against_origin(&args).map(|_| ())
        }
        Command::Shards(args) => workload(&args.common, || harness::shards::shards(&args)),
        Command::Checkpoint(args) => {
            workload(&args.common, || harness::checkpoint::checkpoint(&args))
        }
        Command::Report(args) => harness::report::report(&args),
        Command::Serve(args) => serve::serve(args),
        Command::FioReport(args) => fio_report::fio_report(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hydrant-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
