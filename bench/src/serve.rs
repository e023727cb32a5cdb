//! `hydrant-bench serve`: a hydrant server on a scratch data file with no origin, until Ctrl-C,
//! for the workloads (and their peers) to drive without building `hydrant-server` too.

use std::path::PathBuf;
use std::time::Duration;

use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};

use crate::harness::interrupt;

/// How often the serving thread looks for Ctrl-C.
const INTERRUPT_POLL_INTERVAL: Duration = Duration::from_millis(200);

#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:7711")]
    listen: std::net::SocketAddr,
    /// The data file (formatted, so overwritten).
    #[arg(long, default_value = "target/bench-scratch/serve.hyd")]
    data: PathBuf,
    #[arg(long, default_value_t = 4096)]
    data_mib: u64,
    /// Shards; default one per core.
    #[arg(long)]
    shards: Option<usize>,
    /// Cores to pin the shards to, comma-separated; default shard i on core i.
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// The DRAM tier, all shards together; 0 serves every GET from the data file.
    #[arg(long, default_value_t = 256)]
    dram_mib: u64,
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    if let Some(folder) = args.data.parent() {
        std::fs::create_dir_all(folder)
            .map_err(|error| format!("{}: {error}", folder.display()))?;
    }
    let _ = std::fs::remove_file(&args.data);
    let mut engine = EngineConfig::new(vec![DeviceConfig::create(&args.data, args.data_mib << 20)]);
    engine.format = FormatPolicy::Always;
    engine.shards = args.shards;
    engine.cpus = args.cpus;
    engine.dram_bytes = args.dram_mib << 20;
    let server = Server::start(ServerConfig::new(args.listen, engine))?;
    interrupt::install();
    eprintln!("serving on {} until Ctrl-C", server.address());
    while !interrupt::interrupted() {
        std::thread::sleep(INTERRUPT_POLL_INTERVAL);
    }
    server.stop().map_err(|error| error.to_string())?;
    let _ = std::fs::remove_file(&args.data);
    Ok(())
}
