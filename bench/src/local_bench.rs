//! The same-host path against TCP on loopback and against fio on the same file, in one run:
//! 1 MiB reads of objects on NVMe (no DRAM tier by default), throughput and CPU seconds per GiB
//! (getrusage of this process, which holds the server and the clients; fio's from
//! RUSAGE_CHILDREN).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use hydrant_client::local::{wait_rings, LocalClient, LocalGet};
use hydrant_client::Client;
use hydrant_engine::device::DeviceConfig;
use hydrant_engine::{EngineConfig, FormatPolicy};
use hydrant_server::{Server, ServerConfig};
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;

#[derive(Args)]
pub struct LocalArgs {
    /// Directory for the server's data file and socket (overwritten).
    #[arg(long, default_value = "target/bench-scratch")]
    dir: PathBuf,
    /// Objects of `object_bytes` loaded, then read round robin.
    #[arg(long, default_value_t = 256)]
    objects: usize,
    #[arg(long, default_value_t = 1 << 20)]
    object_bytes: usize,
    /// Readers at once (threads, one connection each).
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Reads in flight per stream through the same-host rings; fio reads at a depth of
    /// streams × depth. The one-at-a-time same-host reads and TCP keep one per stream.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The DRAM tier (0: every read from NVMe).
    #[arg(long, default_value_t = 0)]
    dram_bytes: u64,
    /// Measure writes instead: same-host WRITEs from a region (the writer's copy into it
    /// included) and WRITE_MEMORYs from the writer's buffer, against TCP PUTs of the same
    /// objects, and fio writing a file beside the data file sequentially (1 MiB, depth 8).
    #[arg(long)]
    write: bool,
}

/// CPU seconds (user + system) of this process, or of its waited-for children.
fn cpu_seconds(who: UsageWho) -> f64 {
    let Ok(usage) = getrusage(who) else {
        return 0.0;
    };
    let seconds = |time: TimeVal| time.tv_sec() as f64 + time.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

/// The server's counters of CPU-copied and delivered object bytes on `path` ("local", "tcp").
fn copy_counters(client: &mut Client, path: &str) -> Result<(u64, u64), String> {
    let stats = client.stats().map_err(|error| error.to_string())?;
    let value = |name: &str| -> u64 {
        let series = format!("{name}{{path=\"{path}\"}} ");
        stats
            .iter()
            .flat_map(|(_, text)| text.lines())
            .filter_map(|line| line.strip_prefix(series.as_str()))
            .filter_map(|number| number.trim().parse::<u64>().ok())
            .sum()
    };
    Ok((
        value("hydrant_copied_bytes_total"),
        value("hydrant_delivered_bytes_total"),
    ))
}

/// CPU copies per byte delivered between two readings of `copy_counters`.
fn copies_per_byte(before: (u64, u64), after: (u64, u64)) -> f64 {
    let delivered = after.1 - before.1;
    if delivered == 0 {
        return 0.0;
    }
    (after.0 - before.0) as f64 / delivered as f64
}

struct Figure {
    gib_per_second: f64,
    cpu_seconds_per_gib: f64,
}

/// `streams` threads reading one at a time, each `read(round)` returning the bytes it read.
fn measure(streams: usize, seconds: u64, read: impl Fn(usize) -> u64 + Sync) -> Figure {
    measure_streams(streams, seconds, |stream, deadline| {
        let mut bytes = 0;
        let mut round = stream;
        while Instant::now() < deadline {
            bytes += read(round);
            round += streams;
        }
        bytes
    })
}

/// `streams` threads each running `work(stream, deadline)`, which returns the bytes it read:
/// GiB/s of all together, and CPU seconds of this process (server and clients) per GiB.
fn measure_streams(
    streams: usize,
    seconds: u64,
    work: impl Fn(usize, Instant) -> u64 + Sync,
) -> Figure {
    let cpu_before = cpu_seconds(UsageWho::RUSAGE_SELF);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let bytes: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..streams)
            .map(|stream| {
                let work = &work;
                scope.spawn(move || work(stream, deadline))
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .sum()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(UsageWho::RUSAGE_SELF) - cpu_before;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    Figure {
        gib_per_second: gib / elapsed,
        cpu_seconds_per_gib: cpu / gib,
    }
}

/// One stream's reads through same-host rings until `deadline`: a connection, a region of
/// `depth` slots of `object_bytes`, a ring on every shard, each key submitted to its owner's
/// ring, `depth` reads in flight. Every read's length is checked.
fn ring_stream(
    socket: &std::path::Path,
    stream: usize,
    streams: usize,
    depth: usize,
    objects: usize,
    object_bytes: usize,
    deadline: Instant,
) -> Result<u64, String> {
    let error = |error: hydrant_client::ClientError| error.to_string();
    let mut client = LocalClient::connect(socket).map_err(error)?;
    let slot_bytes = (object_bytes as u64).div_ceil(4096) * 4096;
    let region = client.allocate(slot_bytes * depth as u64).map_err(error)?;
    let entries = (depth as u32).next_power_of_two();
    let first = client.open_ring(&region, entries, Some(0)).map_err(error)?;
    let mut rings = vec![first];
    for shard in 1..rings[0].shards() {
        rings.push(
            client
                .open_ring(&region, entries, Some(shard))
                .map_err(error)?,
        );
    }
    let mut free: Vec<u64> = (0..depth as u64).collect();
    let mut next = stream;
    let mut bytes = 0u64;
    let mut done = Vec::with_capacity(depth);
    loop {
        if Instant::now() < deadline {
            while let Some(slot) = free.pop() {
                let key = format!("o{}", next % objects);
                next += streams;
                let shard = rings[0].shard_for("bench", &key) as usize;
                let get = LocalGet {
                    offset: slot * slot_bytes,
                    length: slot_bytes,
                    bucket: "bench".into(),
                    key,
                    range: None,
                };
                rings[shard].push(&get, slot).map_err(error)?;
            }
        }
        if rings.iter().all(|ring| ring.in_flight() == 0) {
            return Ok(bytes);
        }
        done.clear();
        wait_rings(&mut rings, 1, &mut done, Some(Duration::from_secs(30))).map_err(error)?;
        for completion in done.drain(..) {
            let info = completion.result.map_err(error)?;
            if info.written != object_bytes as u64 {
                return Err(format!("a ring read wrote {} bytes", info.written));
            }
            bytes += info.written;
            free.push(completion.user_data);
        }
    }
}

/// A metric summed over the server's shards, from STATS.
fn metric(client: &mut Client, name: &str) -> Result<u64, String> {
    let stats = client.stats().map_err(|error| error.to_string())?;
    Ok(stats
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter(|line| line.split([' ', '{']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Writes: `--objects` keys overwritten round robin by `--streams` writers, through the
/// same-host path (from a region, and from the writer's own memory) and over TCP, and fio's
/// sequential write rate on the same file system: at the start and at the end of each round
/// (the peer is the mean of the two, so that a disk whose rate drifts during the round weighs
/// on both sides alike), and with an fsync after every object's bytes (what a writer pays that
/// makes each object durable before it goes on, as an acknowledged put is).
fn writes(args: &LocalArgs, socket: &std::path::Path, address: &[String]) -> Result<(), String> {
    let error = |error: hydrant_client::ClientError| error.to_string();
    let object_bytes = args.object_bytes;
    let value: Vec<u8> = (0..object_bytes).map(|byte| (byte * 31) as u8).collect();
    let fio_path = args.dir.join("local-bench-fio.dat");
    crate::fio::fill(&fio_path, 1 << 30)?;
    let mut stats = Client::connect(address, Duration::from_secs(30)).map_err(error)?;
    println!(
        "| round | same-host from a region, filled each time GiB/s | CPU s/GiB | copies/byte | same-host from memory GiB/s | CPU s/GiB | TCP loopback GiB/s | CPU s/GiB | fio write GiB/s (mean of first and last) | fio CPU s/GiB | same-host from a region already holding the bytes GiB/s | CPU s/GiB | fio first GiB/s | fio last GiB/s | fio with an fsync per object GiB/s |  ({} keys of {} bytes overwritten, {} writers)",
        args.objects, object_bytes, args.streams
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let fio_write = || -> Result<(f64, f64), String> {
        let children_before = cpu_seconds(UsageWho::RUSAGE_CHILDREN);
        let fio = crate::fio::run(
            &fio_path,
            "local-bench-write",
            "write",
            "1m",
            8,
            args.seconds,
            None,
        )?;
        let cpu = cpu_seconds(UsageWho::RUSAGE_CHILDREN) - children_before;
        Ok((fio.bytes_per_second / (1u64 << 30) as f64, cpu))
    };
    for round in 1..=args.rounds {
        let (fio_first, fio_first_cpu) = fio_write()?;
        let locals: Vec<_> = (0..args.streams)
            .map(|_| {
                let mut client = LocalClient::connect(socket).map_err(error)?;
                let mut region = client.allocate(object_bytes as u64).map_err(error)?;
                region.as_mut_slice()[..object_bytes].copy_from_slice(&value);
                Ok(std::sync::Mutex::new((client, region)))
            })
            .collect::<Result<_, String>>()?;
        let written_before = metric(&mut stats, "hydrant_shared_write_bytes_total")?;
        let copied_before = metric(&mut stats, "hydrant_shared_write_copied_bytes_total")?;
        // `fill`: what a writer whose bytes are elsewhere does first, copy them into the
        // region (warm after the first time); without it, the region already holds them, as
        // after a GPU's copy into it or a serializer that writes there.
        let from_region = |fill: bool| {
            measure(args.streams, args.seconds, |index| {
                let mut guard = locals[index % locals.len()].lock().unwrap();
                let (client, region) = &mut *guard;
                let key = format!("w{}", index % args.objects);
                if fill {
                    region.as_mut_slice()[..object_bytes].copy_from_slice(&value);
                }
                client
                    .write_from(
                        region,
                        0,
                        object_bytes as u64,
                        "bench",
                        &key,
                        hydrant_client::local::LocalCondition::None,
                    )
                    .expect("same-host write");
                object_bytes as u64
            })
        };
        let local = from_region(true);
        let in_place = from_region(false);
        drop(locals);
        let written = metric(&mut stats, "hydrant_shared_write_bytes_total")? - written_before;
        let copied = metric(&mut stats, "hydrant_shared_write_copied_bytes_total")? - copied_before;
        let copies = copied as f64 / written.max(1) as f64;
        // WRITE_MEMORY: the server reads the writer's own buffer; no region.
        let memories: Vec<_> = (0..args.streams)
            .map(|_| {
                LocalClient::connect(socket)
                    .map(std::sync::Mutex::new)
                    .map_err(error)
            })
            .collect::<Result<_, String>>()?;
        let memory = measure(args.streams, args.seconds, |index| {
            let mut client = memories[index % memories.len()].lock().unwrap();
            let key = format!("w{}", index % args.objects);
            client
                .write_memory(
                    &[&value],
                    "bench",
                    &key,
                    hydrant_client::local::LocalCondition::None,
                )
                .expect("same-host write from memory");
            object_bytes as u64
        });
        drop(memories);
        let tcps: Vec<_> = (0..args.streams)
            .map(|_| {
                Client::connect(address, Duration::from_secs(30))
                    .map(std::sync::Mutex::new)
                    .map_err(error)
            })
            .collect::<Result<_, String>>()?;
        let tcp = measure(args.streams, args.seconds, |index| {
            let mut client = tcps[index % tcps.len()].lock().unwrap();
            let key = format!("w{}", index % args.objects);
            client.put("bench", &key, &value).expect("tcp put");
            object_bytes as u64
        });
        drop(tcps);
        let flushing = crate::fio::run_flushing(
            &fio_path,
            "local-bench-write-flushing",
            "1m",
            8,
            args.seconds,
            (object_bytes as u64).div_ceil(1 << 20),
        )?
        .bytes_per_second
            / (1u64 << 30) as f64;
        let (fio_last, fio_last_cpu) = fio_write()?;
        let fio_gib = (fio_first + fio_last) / 2.0;
        let fio_cpu_per_gib =
            (fio_first_cpu + fio_last_cpu) / ((fio_first + fio_last) * args.seconds as f64);
        println!(
            "| {round} | {:.2} | {:.3} | {copies:.2} | {:.2} | {:.3} | {:.2} | {:.3} | {fio_gib:.2} | {fio_cpu_per_gib:.3} | {:.2} | {:.3} | {fio_first:.2} | {fio_last:.2} | {flushing:.2} |",
            local.gib_per_second,
            local.cpu_seconds_per_gib,
            memory.gib_per_second,
            memory.cpu_seconds_per_gib,
            tcp.gib_per_second,
            tcp.cpu_seconds_per_gib,
            in_place.gib_per_second,
            in_place.cpu_seconds_per_gib,
        );
    }
    let _ = std::fs::remove_file(&fio_path);
    Ok(())
}

pub fn local(args: LocalArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|error| error.to_string())?;
    let path = args.dir.join("local-bench.hyd");
    let socket = args.dir.join("local-bench.sock");
    let _ = std::fs::remove_file(&path);
    // Room for the keys written over and over, their overwritten versions and reclaim.
    let data_bytes = (2u64 << 30).max(args.object_bytes as u64 * 8);
    let device = if args.write {
        DeviceConfig::create(&path, data_bytes)
    } else {
        // Written through, so that fio's reads of it touch the device and not unwritten extents
        // (which read as zeros without any I/O).
        crate::fio::fill(&path, data_bytes)?;
        DeviceConfig::new(&path)
    };
    let mut engine = EngineConfig::new(vec![device]);
    engine.shards = Some(2);
    engine.format = FormatPolicy::Always;
    engine.dram_bytes = args.dram_bytes;
    let server = Server::start(ServerConfig {
        local_socket: Some(socket.clone()),
        ..ServerConfig::new("127.0.0.1:0".parse().expect("address"), engine)
    })?;
    let address = vec![server.address().to_string()];
    if args.write {
        let measured = writes(&args, &socket, &address);
        server.stop().map_err(|error| error.to_string())?;
        return measured;
    }
    let error = |error: hydrant_client::ClientError| error.to_string();
    let mut loader = Client::connect(&address, Duration::from_secs(30)).map_err(error)?;
    for index in 0..args.objects {
        let value: Vec<u8> = (0..args.object_bytes)
            .map(|byte| (byte as u64 * 31 + index as u64) as u8)
            .collect();
        loader
            .put("bench", &format!("o{index}"), &value)
            .map_err(error)?;
    }
    let objects = args.objects;
    let object_bytes = args.object_bytes;

    println!(
        "| round | same-host rings GiB/s | CPU s/GiB | copies/byte | same-host one at a time GiB/s | CPU s/GiB | copies/byte | TCP loopback GiB/s | CPU s/GiB | copies/byte | fio GiB/s | fio CPU s/GiB |  ({} objects of {} bytes, {} streams, rings {} deep each, fio at depth {}, DRAM tier {} bytes)",
        objects, object_bytes, args.streams, args.depth, args.streams * args.depth, args.dram_bytes
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let depth = args.depth.max(1);
    for round in 1..=args.rounds {
        // Same-host rings: `depth` reads in flight per stream.
        let ring_before = copy_counters(&mut loader, "local")?;
        let failure = std::sync::Mutex::new(None);
        let rings = measure_streams(args.streams, args.seconds, |stream, deadline| {
            ring_stream(
                &socket,
                stream,
                args.streams,
                depth,
                objects,
                object_bytes,
                deadline,
            )
            .unwrap_or_else(|error| {
                *failure.lock().unwrap() = Some(error);
                0
            })
        });
        if let Some(error) = failure.into_inner().unwrap() {
            return Err(format!("same-host rings: {error}"));
        }
        let ring_copies = copies_per_byte(ring_before, copy_counters(&mut loader, "local")?);
        // Same-host: one connection and region per stream.
        let locals: Vec<_> = (0..args.streams)
            .map(|_| {
                let mut client = LocalClient::connect(&socket).map_err(error)?;
                let region = client.allocate(object_bytes as u64).map_err(error)?;
                Ok(std::sync::Mutex::new((client, region)))
            })
            .collect::<Result<_, String>>()?;
        let local_before = copy_counters(&mut loader, "local")?;
        let local = measure(args.streams, args.seconds, |index| {
            let mut guard = locals[index % locals.len()].lock().unwrap();
            let (client, region) = &mut *guard;
            let info = client
                .read_into(region, 0, "bench", &format!("o{}", index % objects), None)
                .expect("local read");
            info.written
        });
        drop(locals);
        let local_copies = copies_per_byte(local_before, copy_counters(&mut loader, "local")?);
        // TCP on loopback, into a buffer of the caller's (get_into).
        let tcps: Vec<_> = (0..args.streams)
            .map(|_| {
                let client = Client::connect(&address, Duration::from_secs(30)).map_err(error)?;
                Ok(std::sync::Mutex::new((client, vec![0u8; object_bytes])))
            })
            .collect::<Result<_, String>>()?;
        let tcp_before = copy_counters(&mut loader, "tcp")?;
        let tcp = measure(args.streams, args.seconds, |index| {
            let mut guard = tcps[index % tcps.len()].lock().unwrap();
            let (client, buffer) = &mut *guard;
            let (_, len) = client
                .get_into("bench", &format!("o{}", index % objects), None, buffer)
                .expect("tcp read");
            len as u64
        });
        drop(tcps);
        let tcp_copies = copies_per_byte(tcp_before, copy_counters(&mut loader, "tcp")?);
        // fio: the same file, random direct reads of the same size at the rings' total depth.
        let children_before = cpu_seconds(UsageWho::RUSAGE_CHILDREN);
        let fio = crate::fio::run(
            &path,
            "local-bench",
            "randread",
            &format!("{}", object_bytes),
            (args.streams * depth) as u32,
            args.seconds,
            None,
        )?;
        let fio_cpu = cpu_seconds(UsageWho::RUSAGE_CHILDREN) - children_before;
        let fio_gib = fio.bytes_per_second / (1u64 << 30) as f64;
        let fio_cpu_per_gib = fio_cpu / (fio_gib * args.seconds as f64);
        println!(
            "| {round} | {:.2} | {:.3} | {ring_copies:.2} | {:.2} | {:.3} | {local_copies:.2} | {:.2} | {:.3} | {tcp_copies:.2} | {:.2} | {:.3} |",
            rings.gib_per_second,
            rings.cpu_seconds_per_gib,
            local.gib_per_second,
            local.cpu_seconds_per_gib,
            tcp.gib_per_second,
            tcp.cpu_seconds_per_gib,
            fio_gib,
            fio_cpu_per_gib
        );
    }
    server.stop().map_err(|error| error.to_string())?;
    Ok(())
}
