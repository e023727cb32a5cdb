//! The key-value workloads: `get`, `put` and `mixed` over `--keys` keys of `--value-bytes` each,
//! chosen uniformly or by Zipf's law (rank 1 is the hottest key).

use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use super::runner::{self, ThreadBody, ThreadContext};
use super::schema::RunReport;
use super::zipf::{KeyChooser, Random};
use super::{parameters_of, report_of, value_of, CommonArgs};

/// Without `--duration` or `--ops`, a run lasts this long.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipf,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct KeyValueArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    #[arg(long, default_value_t = 4096)]
    pub value_bytes: usize,
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,
    /// Zipf's exponent (alpha): 0.99 is YCSB's; larger is more skewed.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_exponent: f64,
    /// Keys are named PREFIX + their number.
    #[arg(long, default_value = "kv/")]
    pub key_prefix: String,
    /// Skip the load phase (the keys are already there, from an earlier run).
    #[arg(long)]
    pub no_load: bool,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct MixedArgs {
    #[command(flatten)]
    pub key_value: KeyValueArgs,
    /// The share of operations that are GETs; the rest are PUTs of the same keys.
    #[arg(long, default_value_t = 0.9)]
    pub read_fraction: f64,
}

impl KeyValueArgs {
    fn validate(&self) -> Result<(), String> {
        self.common.validate()?;
        if self.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        if !(self.zipf_exponent > 0.0 && self.zipf_exponent.is_finite()) {
            return Err("--zipf-exponent must be above 0".into());
        }
        Ok(())
    }

    fn chooser(&self) -> KeyChooser {
        match self.distribution {
            Distribution::Uniform => KeyChooser::uniform(self.keys),
            Distribution::Zipf => KeyChooser::zipf(self.keys, self.zipf_exponent),
        }
    }

    fn key(&self, index: u64) -> String {
        format!("{}{index:012}", self.key_prefix)
    }
}

/// PUT every key once, the connections sharing the keys, so that GETs find them.
fn load(args: &KeyValueArgs) -> Result<(), String> {
    let started = Instant::now();
    let connections = args.common.connections as u64;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..connections)
            .map(|thread| {
                scope.spawn(move || -> Result<(), String> {
                    let mut client = args.common.connect()?;
                    let value = value_of(args.value_bytes, thread);
                    for index in (thread..args.keys).step_by(connections as usize) {
                        client
                            .put(&args.common.bucket, &args.key(index), &value)
                            .map_err(|error| format!("loading {}: {error}", args.key(index)))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|handle| handle.join().expect("a load thread panicked"))
    })?;
    eprintln!(
        "loaded {} keys of {} bytes in {:.1} s",
        args.keys,
        args.value_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// GETs of keys chosen by `--distribution`.
pub fn get(args: &KeyValueArgs) -> Result<RunReport, String> {
    run("get", args, 1.0, parameters_of(args))
}

/// PUTs of keys chosen by `--distribution`, overwriting them.
pub fn put(args: &KeyValueArgs) -> Result<RunReport, String> {
    run("put", args, 0.0, parameters_of(args))
}

/// GETs with probability `--read-fraction`, PUTs of the same keys otherwise.
pub fn mixed(args: &MixedArgs) -> Result<RunReport, String> {
    if !(0.0..=1.0).contains(&args.read_fraction) {
        return Err("--read-fraction must be between 0 and 1".into());
    }
    run(
        "mixed",
        &args.key_value,
        args.read_fraction,
        parameters_of(args),
    )
}

const GET: usize = 0;
const PUT: usize = 1;
const KINDS: [&str; 2] = ["get", "put"];

fn run(
    workload: &str,
    args: &KeyValueArgs,
    read_fraction: f64,
    parameters: std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<RunReport, String> {
    args.validate()?;
    let common = &args.common;
    let bounds = common.bounds(Some(DEFAULT_DURATION))?;
    // Nothing needs to be there before a PUT.
    if !args.no_load && read_fraction > 0.0 {
        load(args)?;
    }
    let chooser = args.chooser();
    let mut bodies: Vec<ThreadBody<()>> = Vec::with_capacity(common.connections);
    for thread in 0..common.connections {
        let mut client = common.connect()?;
        let mut random = Random::new(common.thread_seed(thread));
        let value = value_of(args.value_bytes, thread as u64);
        let chooser = &chooser;
        bodies.push(Box::new(move |context: &mut ThreadContext| {
            while context.next().is_some() {
                let key = args.key(chooser.next(&mut random));
                if read_fraction >= 1.0 || random.next_unit() < read_fraction {
                    context.measure(GET, || {
                        let (_, data) = client.get(&common.bucket, &key, None)?;
                        Ok(data.len() as u64)
                    })?;
                } else {
                    context.measure(PUT, || {
                        client.put(&common.bucket, &key, &value)?;
                        Ok(value.len() as u64)
                    })?;
                }
            }
            Ok(())
        }));
    }
    let started = SystemTime::now();
    let measured = runner::run(&KINDS, bounds, bodies)?;
    Ok(report_of(workload, common, parameters, &measured, started))
}
