//! `hydrant`: the command-line client.
//!
//! Exit status: 0 on success, 3 when the object is not found, 1 for any other failure (with a
//! one-line reason on stderr), 2 for bad usage. Puts and gets of large objects show a progress
//! bar on stderr when it is a terminal.

mod progress;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use progress::ProgressBar;

use clap::{Parser, Subcommand};
use hydrant_client::{Client, ClientError};

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_NOT_FOUND: u8 = 3;
/// Keys asked for per page of `ls` by default, and at most (the server's page limit).
const LIST_PAGE_DEFAULT: u32 = 10_000;

#[derive(Parser)]
#[command(
    name = "hydrant",
    about = "Put, get and list objects on hydrant servers"
)]
struct Arguments {
    /// Servers, comma-separated; keys are placed on them by rendezvous hashing.
    #[arg(
        long,
        env = "HYDRANT_SERVER",
        default_value = "127.0.0.1:7700",
        value_delimiter = ','
    )]
    server: Vec<String>,
    /// Seconds to wait for a server before giving up.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Store FILE (or standard input, `-` or nothing) as BUCKET/KEY.
    Put {
        object: String,
        file: Option<String>,
    },
    /// Write BUCKET/KEY to FILE (or standard output).
    Get {
        object: String,
        file: Option<String>,
        /// Bytes START-END, both included (END may be left out: to the end).
        #[arg(long)]
        range: Option<String>,
    },
    /// Size and version of BUCKET/KEY.
    Stat { object: String },
    /// Keys of BUCKET[/PREFIX], all of them, a page at a time.
    Ls {
        path: String,
        /// Keys asked for per request.
        #[arg(long, default_value_t = LIST_PAGE_DEFAULT)]
        page_size: u32,
    },
    /// Delete BUCKET/KEY.
    Rm { object: String },
    /// Every server's metrics, in the Prometheus text format.
    Stats,
    /// Read every object of BUCKET[/PREFIX] through from the origin into the cache.
    Prefetch { path: String },
    /// Writes under [BUCKET[/PREFIX]] that the origin refused for good (they stay on the node
    /// until retried, replaced or deleted).
    Uploads {
        path: Option<String>,
        /// Queue them for upload again (once the origin can take them).
        #[arg(long)]
        retry: bool,
    },
    /// Wait until what was written to [BUCKET[/PREFIX]] (everything, without one) is at the
    /// origin.
    Flush {
        path: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        wait: u64,
    },
}

/// Standard input as a PUT's source and its size: as it is when it is a regular file,
/// else copied into an unlinked temporary file first.
fn stdin_source() -> Result<(std::fs::File, u64), ClientError> {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let handle = stdin.as_fd().try_clone_to_owned()?;
    let file = std::fs::File::from(handle);
    let meta = file.metadata()?;
    if meta.is_file() {
        let position = std::io::Seek::stream_position(&mut &file)?;
        return Ok((file, meta.len().saturating_sub(position)));
    }
    let directory = std::env::temp_dir();
    let path = directory.join(format!("hydrant-put-{}", std::process::id()));
    let mut spool = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let _ = std::fs::remove_file(&path);
    let bytes = std::io::copy(&mut stdin.lock(), &mut spool)?;
    std::io::Seek::rewind(&mut spool)?;
    Ok((spool, bytes))
}

/// Refused writes `hydrant uploads` shows per server.
const UPLOADS_SHOWN_MAX: u32 = 1000;

/// An optional "BUCKET[/PREFIX]" into a bucket (`None`: every bucket) and a prefix.
fn split_path(path: Option<&str>) -> (Option<&str>, &str) {
    match path {
        Some(path) => {
            let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
            (Some(bucket), prefix)
        }
        None => (None, ""),
    }
}

/// "BUCKET/KEY" into its parts; the key must not be empty.
fn split_object(object: &str) -> Result<(&str, &str), ClientError> {
    match object.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => Ok((bucket, key)),
        _ => Err(ClientError::Usage(format!("{object:?} is not BUCKET/KEY"))),
    }
}

/// "START-END" (END included, optional) into a start and an exclusive end.
fn parse_range(range: &str) -> Result<(u64, Option<u64>), ClientError> {
    let invalid = || ClientError::Usage(format!("--range {range:?} is not START-END or START-"));
    let (start, end) = range.split_once('-').ok_or_else(invalid)?;
    let start: u64 = start.parse().map_err(|_| invalid())?;
    let end = match end {
        "" => None,
        end => {
            let last: u64 = end.parse().map_err(|_| invalid())?;
            if last < start {
                return Err(invalid());
            }
            // The last possible byte means "to the end".
            last.checked_add(1)
        }
    };
    Ok((start, end))
}

/// A local file that could not be read or written: a failure (exit 1), not a usage error.
fn local_error(path: &str, error: std::io::Error) -> ClientError {
    ClientError::Io(std::io::Error::new(
        error.kind(),
        format!("{path}: {error}"),
    ))
}

fn run(arguments: Arguments) -> Result<(), ClientError> {
    let token = std::env::var("HYDRANT_TOKEN").ok();
    let connect = || {
        let token = token.as_deref().map(str::as_bytes);
        Client::connect_with_token(
            &arguments.server,
            token,
            Duration::from_secs(arguments.timeout),
        )
    };
    match &arguments.command {
        Command::Put { object, file } => {
            let (bucket, key) = split_object(object)?;
            // Streamed from the file (or standard input, spooled to a temporary file first
            // when it is a pipe, since a PUT states its size up front): never whole in memory.
            let (mut source, object_bytes) = match file.as_deref() {
                None | Some("-") => stdin_source()?,
                Some(path) => {
                    let source =
                        std::fs::File::open(path).map_err(|error| local_error(path, error))?;
                    let bytes = source
                        .metadata()
                        .map_err(|error| local_error(path, error))?
                        .len();
                    (source, bytes)
                }
            };
            let mut reader = std::io::BufReader::with_capacity(1 << 20, &mut source);
            let mut bar = ProgressBar::for_stderr();
            let info = connect()?.put_from(
                bucket,
                key,
                &mut reader,
                object_bytes,
                Some(&mut |done, total| bar.update(done, total)),
            )?;
            bar.finish();
            eprintln!(
                "stored {object}: {} bytes, version {}",
                info.object_bytes, info.seq
            );
        }
        Command::Get {
            object,
            file,
            range,
        } => {
            let (bucket, key) = split_object(object)?;
            let range = range.as_deref().map(parse_range).transpose()?;
            let mut bar = ProgressBar::for_stderr();
            let mut progress = |done, total| bar.update(done, total);
            let mut client = connect()?;
            // Written as it arrives, never whole in memory.
            match file.as_deref() {
                None | Some("-") => {
                    let stdout = std::io::stdout();
                    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
                    client.get_to(bucket, key, range, &mut out, Some(&mut progress))?;
                    out.flush()?;
                }
                Some(path) => {
                    let file =
                        std::fs::File::create(path).map_err(|error| local_error(path, error))?;
                    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                    client.get_to(bucket, key, range, &mut out, Some(&mut progress))?;
                    out.flush().map_err(|error| local_error(path, error))?;
                }
            }
            bar.finish();
        }
        Command::Stat { object } => {
            let (bucket, key) = split_object(object)?;
            let info = connect()?.head(bucket, key)?;
            println!(
                "{object}\t{} bytes\tversion {}\t{}",
                info.object_bytes,
                info.seq,
                if info.dirty { "dirty" } else { "clean" }
            );
        }
        Command::Ls { path, page_size } => {
            let page_size = (*page_size).clamp(1, LIST_PAGE_DEFAULT);
            let (bucket, prefix) = path.split_once('/').unwrap_or((path.as_str(), ""));
            let mut client = connect()?;
            let mut after: Option<String> = None;
            // Page through the keys until a page comes back short.
            loop {
                let page = client.list(bucket, prefix, after.as_deref(), page_size)?;
                for entry in &page {
                    println!("{}\t{}", entry.object_bytes, entry.key);
                }
                match page.last() {
                    Some(last) if page.len() == page_size as usize => {
                        after = Some(last.key.clone())
                    }
                    _ => break,
                }
            }
        }
        Command::Stats => {
            for (address, text) in connect()?.stats()? {
                println!("# server {address}");
                print!("{text}");
            }
        }
        Command::Rm { object } => {
            let (bucket, key) = split_object(object)?;
            connect()?.delete(bucket, key)?;
        }
        Command::Prefetch { path } => {
            let (bucket, prefix) = path.split_once('/').unwrap_or((path.as_str(), ""));
            let started = std::time::Instant::now();
            let (objects, bytes) = connect()?.prefetch(bucket, prefix)?;
            println!(
                "warmed {objects} objects, {bytes} bytes, in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Command::Flush { path, wait } => {
            let (bucket, prefix) = split_path(path.as_deref());
            connect()?.flush(bucket, prefix, Duration::from_secs(*wait))?;
        }
        Command::Uploads { path, retry } => {
            let (bucket, prefix) = split_path(path.as_deref());
            let (refused, total) = connect()?.uploads(bucket, prefix, *retry, UPLOADS_SHOWN_MAX)?;
            for upload in &refused {
                println!(
                    "{}/{}\t{} bytes\t{}",
                    upload.bucket, upload.key, upload.object_bytes, upload.reason
                );
            }
            let verb = if *retry {
                "queued again"
            } else {
                "refused by the origin"
            };
            println!("{total} writes {verb}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    match run(arguments) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("hydrant: {error}");
            ExitCode::from(match &error {
                error if error.is_not_found() => EXIT_NOT_FOUND,
                ClientError::Usage(_) => EXIT_USAGE,
                _ => EXIT_FAILURE,
            })
        }
    }
}
