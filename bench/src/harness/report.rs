//! `hydrant-bench report`: runs side by side, from their JSON reports: one table, and with `--out`
//! two plots, latency percentiles per run and throughput over time.

use std::path::{Path, PathBuf};

use super::schema::{RunReport, ThroughputSample};
use super::{table_rows, TABLE_HEADER};
use crate::plot::{self, Axes, Scale, Series};

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Reports written by the workloads' `--json`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write latency-percentiles.svg, throughput-operations.svg and throughput-mebibytes.svg
    /// here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub const LATENCY_PLOT: &str = "latency-percentiles.svg";
pub const THROUGHPUT_OPERATIONS_PLOT: &str = "throughput-operations.svg";
pub const THROUGHPUT_MEBIBYTES_PLOT: &str = "throughput-mebibytes.svg";

pub fn report(args: &ReportArgs) -> Result<(), String> {
    let reports = args
        .files
        .iter()
        .map(|path| read(path))
        .collect::<Result<Vec<_>, _>>()?;
    print!("{}", table(&reports));
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|error| format!("{}: {error}", out.display()))?;
        plot_latency(&out.join(LATENCY_PLOT), &reports)?;
        // Operations and bytes per second apart: runs of small and large objects differ by
        // orders of magnitude in one and not the other.
        plot_throughput(
            &out.join(THROUGHPUT_OPERATIONS_PLOT),
            &reports,
            "operations/s",
            |sample| sample.operations_per_second,
        )?;
        plot_throughput(
            &out.join(THROUGHPUT_MEBIBYTES_PLOT),
            &reports,
            "MiB/s",
            |sample| sample.mebibytes_per_second,
        )?;
        eprintln!("plots written to {}", out.display());
    }
    Ok(())
}

pub fn read(path: &Path) -> Result<RunReport, String> {
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    RunReport::from_json(&text).map_err(|error| format!("{}: {error}", path.display()))
}

/// The markdown table of every run, one row per run (and per kind of operation in mixed runs).
pub fn table(reports: &[RunReport]) -> String {
    let mut table = format!("{TABLE_HEADER}\n");
    for report in reports {
        for row in table_rows(report) {
            table.push_str(&row);
            table.push('\n');
        }
    }
    for report in reports {
        if let Some(shards) = &report.shards {
            let verdict = match shards.passed {
                Some(true) => "PASS",
                Some(false) => "FAIL",
                None => "n/a",
            };
            let lowest = shards
                .readers
                .iter()
                .filter_map(|reader| reader.accelerator_utilisation_percent)
                .reduce(f64::min);
            table.push_str(&format!(
                "\n{}: accelerator utilisation {} (lowest reader {}; bar {:.0}%)\n",
                report.label,
                verdict,
                lowest.map_or("n/a".into(), |percent| format!("{percent:.1}%")),
                shards.utilisation_bar_percent
            ));
        }
        if let Some(checkpoint) = &report.checkpoint {
            table.push_str(&format!(
                "\n{}: acknowledged after {:.2} s, flushed after {}\n",
                report.label,
                checkpoint.seconds_to_acknowledged,
                checkpoint
                    .seconds_to_flushed
                    .map_or("(not flushed)".into(), |seconds| format!("{seconds:.2} s")),
            ));
        }
    }
    table
}

fn plot_latency(path: &Path, reports: &[RunReport]) -> Result<(), String> {
    let labels: Vec<String> = reports[0]
        .latency_us
        .percentiles()
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    let series: Vec<Series> = reports
        .iter()
        .map(|report| Series {
            name: report.label.clone(),
            points: report
                .latency_us
                .percentiles()
                .iter()
                .map(|&(_, microseconds)| microseconds)
                .collect(),
        })
        .collect();
    let axes = Axes {
        x_title: "percentile",
        y_title: "latency us (log scale)",
        scale: Scale::Logarithmic,
    };
    plot::write_chart(path, &axes, &labels, &series)
}

fn plot_throughput(
    path: &Path,
    reports: &[RunReport],
    y_title: &str,
    rate: impl Fn(&ThroughputSample) -> f64,
) -> Result<(), String> {
    let longest = reports
        .iter()
        .map(|report| report.throughput_samples.len())
        .max()
        .unwrap_or(0);
    let labels: Vec<String> = (1..=longest).map(|second| second.to_string()).collect();
    let series: Vec<Series> = reports
        .iter()
        .map(|report| Series {
            name: report.label.clone(),
            points: report.throughput_samples.iter().map(&rate).collect(),
        })
        .collect();
    let axes = Axes {
        x_title: "seconds",
        y_title,
        scale: Scale::Linear,
    };
    plot::write_chart(path, &axes, &labels, &series)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::schema::tests::sample_report;

    #[test]
    fn the_table_has_a_row_per_run_and_kind() {
        let mut second = sample_report();
        second.label = "second".into();
        second.by_operation.clear();
        second.shards = None;
        let table = table(&[sample_report(), second]);
        let rows: Vec<&str> = table
            .lines()
            .filter(|line| line.starts_with("| "))
            .collect();
        // The header, the first run's total and its one kind, the second run.
        assert_eq!(rows.len(), 4, "{table}");
        assert!(
            rows[1].starts_with(
                "| shards-2c | all | 2 | 2.0 | 100 | 50 | 200.0 | 50 | 90 | 120 | 400 | 2000 |"
            ),
            "{}",
            rows[1]
        );
        assert!(rows[3].starts_with("| second | shards |"));
        assert!(table
            .contains("shards-2c: accelerator utilisation FAIL (lowest reader 75.0%; bar 90%)"));
    }

    #[test]
    fn the_plots_are_written() {
        let directory = std::env::current_exe()
            .expect("test binary")
            .parent()
            .expect("its folder")
            .join("harness-report-plots");
        let _ = std::fs::remove_dir_all(&directory);
        let json = directory.join("run.json");
        std::fs::create_dir_all(&directory).unwrap();
        std::fs::write(&json, sample_report().to_json()).unwrap();
        report(&ReportArgs {
            files: vec![json.clone(), json],
            out: Some(directory.clone()),
        })
        .expect("report");
        for plot in [
            LATENCY_PLOT,
            THROUGHPUT_OPERATIONS_PLOT,
            THROUGHPUT_MEBIBYTES_PLOT,
        ] {
            let svg = std::fs::read_to_string(directory.join(plot)).expect(plot);
            assert!(
                svg.starts_with("<svg") && svg.contains("<polyline"),
                "{plot}"
            );
        }
    }
}
