//! `hydrant-bench fio-report DIR`: the JSON reports `fio-profiles/run.sh` saved, one per job, as
//! one markdown table: IOPS, bandwidth and completion-latency percentiles for each direction a job
//! moved data in. A report that does not parse, a job that failed, or one that moved no data is
//! an error, so the CI smoke test fails loudly instead of printing an empty table.

use std::path::{Path, PathBuf};

const NANOSECONDS_PER_MICROSECOND: f64 = 1_000.0;
const BYTES_PER_MEBIBYTE: f64 = 1_048_576.0;
/// fio's keys for the completion-latency percentiles we print, with our names for them.
const PERCENTILES: [(&str, &str); 4] = [
    ("p50", "50.000000"),
    ("p90", "90.000000"),
    ("p99", "99.000000"),
    ("p99.9", "99.900000"),
];

#[derive(clap::Args, Debug)]
pub struct FioReportArgs {
    /// A folder of fio JSON reports (`run.sh --out DIR`), or single report files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// One direction (read or write) of one fio job.
#[derive(Clone, Debug, PartialEq)]
pub struct FioRow {
    pub job: String,
    pub direction: &'static str,
    pub iops: f64,
    pub bytes_per_second: f64,
    /// Completion latency percentiles in microseconds, in `PERCENTILES`' order; `None` where fio
    /// did not report one (percentiles turned off).
    pub percentiles_us: [Option<f64>; 4],
    pub max_us: f64,
}

pub fn fio_report(args: &FioReportArgs) -> Result<(), String> {
    let mut files = Vec::new();
    for path in &args.paths {
        if path.is_dir() {
            let mut in_folder: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|error| format!("{}: {error}", path.display()))?
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|file| {
                    file.extension()
                        .is_some_and(|extension| extension == "json")
                })
                .collect();
            in_folder.sort();
            files.extend(in_folder);
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err("no fio JSON reports found".into());
    }
    let mut rows = Vec::new();
    for file in &files {
        rows.extend(parse_file(file)?);
    }
    print!("{}", table(&rows));
    Ok(())
}

fn parse_file(path: &Path) -> Result<Vec<FioRow>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    parse(&text).map_err(|error| format!("{}: {error}", path.display()))
}

/// The rows of one fio JSON report.
pub fn parse(text: &str) -> Result<Vec<FioRow>, String> {
    // fio may print notices before the JSON document.
    let start = text.find('{').ok_or("no JSON in the report")?;
    let report: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|error| format!("fio JSON: {error}"))?;
    let jobs = report["jobs"].as_array().ok_or("no jobs in the report")?;
    if jobs.is_empty() {
        return Err("no jobs in the report".into());
    }
    let mut rows = Vec::new();
    for job in jobs {
        let name = job["jobname"].as_str().ok_or("a job without a jobname")?;
        if job["error"].as_i64().unwrap_or(0) != 0 {
            return Err(format!("job {name} failed with error {}", job["error"]));
        }
        let before = rows.len();
        for direction in ["read", "write"] {
            let side = &job[direction];
            let moved = side["io_bytes"].as_u64().unwrap_or(0);
            if moved == 0 {
                continue;
            }
            let number = |field: &serde_json::Value, what: &str| {
                field
                    .as_f64()
                    .ok_or_else(|| format!("job {name}: {direction} has no {what}"))
            };
            let completion = &side["clat_ns"];
            let percentiles_us = PERCENTILES.map(|(_, key)| {
                completion["percentile"][key]
                    .as_f64()
                    .map(|nanoseconds| nanoseconds / NANOSECONDS_PER_MICROSECOND)
            });
            rows.push(FioRow {
                job: name.to_string(),
                direction,
                iops: number(&side["iops"], "iops")?,
                bytes_per_second: number(&side["bw_bytes"], "bw_bytes")?,
                percentiles_us,
                max_us: number(&completion["max"], "clat_ns.max")? / NANOSECONDS_PER_MICROSECOND,
            });
        }
        if rows.len() == before {
            return Err(format!("job {name} moved no data"));
        }
    }
    Ok(rows)
}

pub fn table(rows: &[FioRow]) -> String {
    let mut table = String::from("| job | direction | IOPS | MiB/s |");
    for (name, _) in PERCENTILES {
        table.push_str(&format!(" {name} us |"));
    }
    table.push_str(" max us |\n|---|---|---|---|---|---|---|---|---|\n");
    for row in rows {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} |",
            row.job,
            row.direction,
            row.iops,
            row.bytes_per_second / BYTES_PER_MEBIBYTE
        ));
        for percentile in row.percentiles_us {
            match percentile {
                Some(microseconds) => table.push_str(&format!(" {microseconds:.0} |")),
                None => table.push_str(" n/a |"),
            }
        }
        table.push_str(&format!(" {:.0} |\n", row.max_us));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fio 3.33's report of `fio-profiles/randrw-4k-70-30-qd32.fio` for one second on a 16 MiB
    /// file on this machine's virtual disk.
    const SAMPLE: &str = include_str!("../tests/data/fio-randrw-4k-70-30-qd32.json");

    #[test]
    fn a_captured_report_parses() {
        let rows = parse(SAMPLE).expect("parse");
        assert_eq!(rows.len(), 2);
        let read = &rows[0];
        assert_eq!(
            (read.job.as_str(), read.direction),
            ("randrw-4k-70-30-qd32", "read")
        );
        assert!((read.iops - 58_338.323353).abs() < 1e-6);
        assert_eq!(read.bytes_per_second, 238_953_772.0);
        assert_eq!(
            read.percentiles_us,
            [
                Some(252.928),
                Some(428.032),
                Some(3_129.344),
                Some(5_537.792)
            ]
        );
        assert_eq!(read.max_us, 7_688.131);
        let write = &rows[1];
        assert_eq!(write.direction, "write");
        assert!((write.iops - 25_114.770459).abs() < 1e-6);
        assert_eq!(write.percentiles_us[3], Some(7_700.48));
    }

    #[test]
    fn the_table_shows_both_directions() {
        let table = table(&parse(SAMPLE).unwrap());
        assert!(
            table.contains(
                "| randrw-4k-70-30-qd32 | read | 58338 | 227.9 | 253 | 428 | 3129 | 5538 | 7688 |"
            ),
            "{table}"
        );
        assert!(table.contains("| randrw-4k-70-30-qd32 | write | 25115 |"));
    }

    #[test]
    fn notices_before_the_json_are_skipped() {
        let noisy = format!("fio: note: something\n{SAMPLE}");
        assert_eq!(parse(&noisy).unwrap().len(), 2);
    }

    #[test]
    fn broken_reports_are_errors() {
        assert!(parse("").is_err());
        assert!(parse("{\"jobs\": []}").is_err());
        let mut failed: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        failed["jobs"][0]["error"] = serde_json::json!(5);
        assert!(parse(&failed.to_string()).unwrap_err().contains("failed"));
        let mut idle: serde_json::Value = serde_json::from_str(SAMPLE).unwrap();
        idle["jobs"][0]["read"]["io_bytes"] = serde_json::json!(0);
        idle["jobs"][0]["write"]["io_bytes"] = serde_json::json!(0);
        assert!(parse(&idle.to_string()).unwrap_err().contains("no data"));
    }
}
