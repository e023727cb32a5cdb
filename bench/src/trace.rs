//! Cache traces: reading them into memory as (key, size) requests.
//!
//! - `oracle-general`: libCacheSim's binary format, 24-byte little-endian records
//!   `{u32 timestamp; u64 object id; u32 object size; i64 next access (virtual time)}`.
//! - `text`: one key per line; lines starting with `*` are markers (LIRS traces) and skipped.
//! - `csv`: `key,size` per line; a first line whose size is not a number is a header.
//! - `arc`: the ARC paper's traces (`.lis`, as published with it): `start count ...` per line,
//!   a request for each of the `count` blocks from `start` on, one unit each.
//!
//! Any of them may be gzip-compressed (recognised by its magic bytes, not its name). Keys that are
//! not integers are hashed into a `u64`; text keys carry no size, so each request counts one byte
//! (caches for text traces are sized in objects).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::str::FromStr;

/// One oracleGeneral record.
const ORACLE_GENERAL_RECORD_BYTES: usize = 24;
/// Where the object id and size sit in a record (after the u32 timestamp).
const ORACLE_GENERAL_ID_OFFSET: usize = 4;
const ORACLE_GENERAL_SIZE_OFFSET: usize = ORACLE_GENERAL_ID_OFFSET + 8;
/// gzip's first two bytes (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// A zstd frame's first four bytes (RFC 8878): read but not decompressed here.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Most blocks one line of an `arc` trace may ask for (the published traces ask for at most a
/// few hundred); a longer run is refused rather than expanded.
const ARC_BLOCKS_PER_LINE_MAX: u64 = 1 << 20;
/// The size a request of a format without sizes counts.
const TEXT_REQUEST_BYTES: u64 = 1;

/// A trace's on-disk format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    OracleGeneral,
    Text,
    Csv,
    Arc,
}

impl FromStr for TraceFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<TraceFormat, String> {
        match text {
            "oracle-general" => Ok(TraceFormat::OracleGeneral),
            "text" => Ok(TraceFormat::Text),
            "csv" => Ok(TraceFormat::Csv),
            "arc" => Ok(TraceFormat::Arc),
            other => Err(format!(
                "unknown trace format {other:?} (known: oracle-general, text, csv, arc)"
            )),
        }
    }
}

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub key: u64,
    pub size_bytes: u64,
}

/// A whole trace in memory.
pub struct Trace {
    pub requests: Vec<Request>,
}

impl Trace {
    pub fn distinct_objects(&self) -> usize {
        self.requests
            .iter()
            .map(|request| request.key)
            .collect::<HashSet<_>>()
            .len()
    }

    pub fn requested_bytes(&self) -> u64 {
        self.requests.iter().map(|request| request.size_bytes).sum()
    }
}

/// Reads a whole trace file.
pub fn read(path: &Path, format: TraceFormat) -> Result<Trace, String> {
    let file = File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut reader = BufReader::new(file);
    let start = reader
        .fill_buf()
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if start.starts_with(&ZSTD_MAGIC) {
        return Err(format!(
            "{}: zstd-compressed; decompress it first (zstd -d)",
            path.display()
        ));
    }
    let compressed = start.starts_with(&GZIP_MAGIC);
    let reader: Box<dyn BufRead> = if compressed {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader)
    };
    let requests = match format {
        TraceFormat::OracleGeneral => read_oracle_general(reader),
        TraceFormat::Text => read_text(reader),
        TraceFormat::Csv => read_csv(reader),
        TraceFormat::Arc => read_arc(reader),
    }
    .map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(Trace { requests })
}

fn read_oracle_general(mut reader: impl Read) -> Result<Vec<Request>, String> {
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|error| error.to_string())?;
    if bytes.len() % ORACLE_GENERAL_RECORD_BYTES != 0 {
        return Err(format!(
            "{} bytes is not a whole number of {ORACLE_GENERAL_RECORD_BYTES}-byte records",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(ORACLE_GENERAL_RECORD_BYTES)
        .map(|record| {
            let id = &record[ORACLE_GENERAL_ID_OFFSET..ORACLE_GENERAL_SIZE_OFFSET];
            let size = &record[ORACLE_GENERAL_SIZE_OFFSET..ORACLE_GENERAL_SIZE_OFFSET + 4];
            Request {
                key: u64::from_le_bytes(id.try_into().expect("8 bytes")),
                size_bytes: u64::from(u32::from_le_bytes(size.try_into().expect("4 bytes"))),
            }
        })
        .collect())
}

fn read_text(reader: impl BufRead) -> Result<Vec<Request>, String> {
    let mut requests = Vec::new();
    for line in reader.lines() {
        let line = line.map_err(|error| error.to_string())?;
        let key = line.trim();
        if key.is_empty() || key.starts_with('*') {
            continue;
        }
        requests.push(Request {
            key: parse_key(key),
            size_bytes: TEXT_REQUEST_BYTES,
        });
    }
    Ok(requests)
}

fn read_csv(reader: impl BufRead) -> Result<Vec<Request>, String> {
    let mut requests = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(|error| error.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        let (key, size) = line
            .split_once(',')
            .ok_or_else(|| format!("line {}: expected key,size", number + 1))?;
        let size_bytes = match size.trim().parse::<u64>() {
            Ok(size_bytes) => size_bytes,
            Err(_) if number == 0 => continue,
            Err(error) => return Err(format!("line {}: size {size:?}: {error}", number + 1)),
        };
        requests.push(Request {
            key: parse_key(key.trim()),
            size_bytes,
        });
    }
    Ok(requests)
}

fn read_arc(reader: impl BufRead) -> Result<Vec<Request>, String> {
    let mut requests = Vec::new();
    for (number, line) in reader.lines().enumerate() {
        let line = line.map_err(|error| error.to_string())?;
        let mut fields = line.split_whitespace();
        let Some(start) = fields.next() else {
            continue;
        };
        let parse = |field: Option<&str>, what: &str| {
            field
                .and_then(|text| text.parse::<u64>().ok())
                .ok_or_else(|| format!("line {}: expected start count ...: bad {what}", number + 1))
        };
        let start = parse(Some(start), "start")?;
        let count = parse(fields.next(), "count")?;
        if count > ARC_BLOCKS_PER_LINE_MAX || start.checked_add(count).is_none() {
            return Err(format!(
                "line {}: {count} blocks from {start} (at most {ARC_BLOCKS_PER_LINE_MAX} per line)",
                number + 1
            ));
        }
        requests.extend((start..start + count).map(|key| Request {
            key,
            size_bytes: TEXT_REQUEST_BYTES,
        }));
    }
    Ok(requests)
}

/// An integer key as itself; anything else hashed (SipHash with fixed keys, so runs agree).
fn parse_key(text: &str) -> u64 {
    text.parse::<u64>().unwrap_or_else(|_| {
        let mut hasher = DefaultHasher::new();
        text.hash(&mut hasher);
        hasher.finish()
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let directory = std::env::temp_dir().join(format!("hydrant-trace-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("temp dir");
        let path = directory.join(name);
        std::fs::write(&path, bytes).expect("write scratch trace");
        path
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).expect("compress");
        encoder.finish().expect("compress")
    }

    #[test]
    fn reads_oracle_general_records() {
        let mut bytes = Vec::new();
        for (id, size) in [(7u64, 512u32), (u64::MAX, 70_000)] {
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&id.to_le_bytes());
            bytes.extend_from_slice(&size.to_le_bytes());
            bytes.extend_from_slice(&(-1i64).to_le_bytes());
        }
        let trace = read(&scratch("a.bin", &bytes), TraceFormat::OracleGeneral).expect("read");
        assert_eq!(
            trace.requests,
            vec![
                Request {
                    key: 7,
                    size_bytes: 512
                },
                Request {
                    key: u64::MAX,
                    size_bytes: 70_000
                }
            ]
        );
        bytes.pop();
        assert!(read(&scratch("b.bin", &bytes), TraceFormat::OracleGeneral).is_err());
    }

    #[test]
    fn reads_text_plain_or_gzipped_skipping_markers_and_hashing_words() {
        let text = b"1\n*marker\n\n2\nobject/a\n1\n";
        for (name, bytes) in [("t.txt", text.to_vec()), ("t.gz", gzip(text))] {
            let trace = read(&scratch(name, &bytes), TraceFormat::Text).expect("read");
            let keys: Vec<u64> = trace.requests.iter().map(|request| request.key).collect();
            assert_eq!(keys.len(), 4, "{name}");
            assert_eq!((keys[0], keys[1], keys[3]), (1, 2, 1), "{name}");
            assert_eq!(keys[2], parse_key("object/a"));
            assert_ne!(keys[2], parse_key("object/b"));
            assert_eq!(trace.distinct_objects(), 3);
        }
    }

    #[test]
    fn reads_arc_runs_of_blocks_and_refuses_zstd_and_huge_runs() {
        let trace = read(
            &scratch(
                "a.lis",
                b"10 3 0 1

4 1 0 2
",
            ),
            TraceFormat::Arc,
        )
        .expect("read");
        let keys: Vec<u64> = trace.requests.iter().map(|request| request.key).collect();
        assert_eq!(keys, [10, 11, 12, 4]);
        assert!(read(
            &scratch(
                "b.lis",
                b"10 x 0 1
"
            ),
            TraceFormat::Arc
        )
        .is_err());
        assert!(read(
            &scratch(
                "c.lis",
                b"0 99999999999 0 1
"
            ),
            TraceFormat::Arc
        )
        .is_err());
        let zstd = read(
            &scratch("d.lis.zst", &[0x28, 0xb5, 0x2f, 0xfd, 0]),
            TraceFormat::Arc,
        );
        assert!(zstd.is_err_and(|error| error.contains("zstd -d")));
    }

    #[test]
    fn reads_csv_with_or_without_a_header() {
        let trace = read(
            &scratch("c.csv", b"key,size\n5,100\nname,20\n"),
            TraceFormat::Csv,
        )
        .expect("read");
        assert_eq!(
            trace.requests[0],
            Request {
                key: 5,
                size_bytes: 100
            }
        );
        assert_eq!(trace.requests[1].size_bytes, 20);
        assert_eq!(trace.requested_bytes(), 120);
        assert!(read(&scratch("d.csv", b"5,100\n6,x\n"), TraceFormat::Csv).is_err());
    }
}
