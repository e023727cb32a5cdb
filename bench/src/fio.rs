//! Running fio as the peer: the same file, the same block size and queue depth, direct I/O on
//! io_uring. Its JSON report gives the figure we compare against.

use std::path::Path;
use std::process::Command;

/// One fio job's result.
#[derive(Clone, Copy, Debug)]
pub struct FioResult {
    pub iops: f64,
    pub bytes_per_second: f64,
}

/// Run one fio job on `path` and return its figures: the writes' for a pattern that writes,
/// else the reads'.
pub fn run(
    path: &Path,
    name: &str,
    pattern: &str,
    block_size: &str,
    iodepth: u32,
    seconds: u64,
    cpu: Option<usize>,
) -> Result<FioResult, String> {
    run_job(path, name, pattern, block_size, iodepth, seconds, cpu, None)
}

/// `run` of a job that writes, with an fsync after every `fsync_every` writes: what a writer
/// pays that makes its bytes durable before it goes on, as hydrant does before it
/// acknowledges a put.
pub fn run_flushing(
    path: &Path,
    name: &str,
    block_size: &str,
    iodepth: u32,
    seconds: u64,
    fsync_every: u64,
) -> Result<FioResult, String> {
    run_job(
        path,
        name,
        "write",
        block_size,
        iodepth,
        seconds,
        None,
        Some(fsync_every),
    )
}

#[allow(clippy::too_many_arguments)]
fn run_job(
    path: &Path,
    name: &str,
    pattern: &str,
    block_size: &str,
    iodepth: u32,
    seconds: u64,
    cpu: Option<usize>,
    fsync_every: Option<u64>,
) -> Result<FioResult, String> {
    let mut command = Command::new("fio");
    command
        .arg(format!("--name={name}"))
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--rw={pattern}"))
        .arg(format!("--bs={block_size}"))
        .arg(format!("--iodepth={iodepth}"))
        .args([
            "--ioengine=io_uring",
            "--direct=1",
            "--numjobs=1",
            "--time_based",
            "--group_reporting",
        ])
        .arg(format!("--runtime={seconds}"))
        .args(["--output-format=json", "--norandommap", "--randrepeat=0"]);
    if let Some(cpu) = cpu {
        command.arg(format!("--cpus_allowed={cpu}"));
    }
    if let Some(every) = fsync_every {
        command.arg(format!("--fsync={every}"));
    }
    let side = if pattern.contains("write") {
        "write"
    } else {
        "read"
    };
    parse(&execute(&mut command)?, side)
}

/// Fill `bytes` of `path` with sequential writes, so that later reads touch written blocks.
pub fn fill(path: &Path, bytes: u64) -> Result<(), String> {
    let mut command = Command::new("fio");
    command
        .arg("--name=fill")
        .arg(format!("--filename={}", path.display()))
        .args([
            "--rw=write",
            "--bs=1m",
            "--iodepth=8",
            "--ioengine=io_uring",
            "--direct=1",
        ])
        .arg(format!("--size={bytes}"))
        .arg("--output-format=json");
    execute(&mut command).map(|_| ())
}

/// Seconds fio takes to read the first `bytes` of `path` once, in direct reads of `block_size`
/// at `iodepth`.
pub fn read_once_seconds(
    path: &Path,
    bytes: u64,
    block_size: &str,
    iodepth: u32,
) -> Result<f64, String> {
    let mut command = Command::new("fio");
    command
        .arg("--name=read-once")
        .arg(format!("--filename={}", path.display()))
        .args(["--rw=read", "--ioengine=io_uring", "--direct=1"])
        .arg(format!("--bs={block_size}"))
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--size={bytes}"))
        .arg("--output-format=json");
    let report = report(&execute(&mut command)?)?;
    let runtime_ms = report["jobs"][0]["read"]["runtime"]
        .as_f64()
        .ok_or("fio JSON has no read runtime")?;
    Ok(runtime_ms / 1000.0)
}

/// Run fio and return what it printed on stdout.
fn execute(command: &mut Command) -> Result<Vec<u8>, String> {
    let output = command
        .output()
        .map_err(|error| format!("cannot run fio (apt-get install -y fio): {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(output.stdout)
}

/// fio's JSON report (it may print notices before the document).
fn report(json: &[u8]) -> Result<serde_json::Value, String> {
    let text = String::from_utf8_lossy(json);
    let start = text.find('{').ok_or("fio printed no JSON")?;
    serde_json::from_str(&text[start..]).map_err(|error| format!("fio JSON: {error}"))
}

fn parse(json: &[u8], side: &str) -> Result<FioResult, String> {
    let report = report(json)?;
    let figures = &report["jobs"][0][side];
    let iops = figures["iops"]
        .as_f64()
        .ok_or_else(|| format!("fio JSON has no {side} iops"))?;
    let bytes_per_second = figures["bw_bytes"]
        .as_f64()
        .ok_or_else(|| format!("fio JSON has no {side} bw_bytes"))?;
    Ok(FioResult {
        iops,
        bytes_per_second,
    })
}
