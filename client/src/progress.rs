//! A progress bar for long transfers, drawn on stderr with a carriage return: no dependency,
//! at most ten redraws a second, and nothing at all when stderr is not a terminal or the
//! object is small.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Objects smaller than this move in well under a second: no bar for them.
const LARGE_OBJECT_BYTES: u64 = 8 << 20;
/// The bar is redrawn at most this often.
const REDRAW_INTERVAL: Duration = Duration::from_millis(100);
const MEBIBYTE_BYTES: f64 = (1u64 << 20) as f64;

pub struct ProgressBar {
    enabled: bool,
    started: Instant,
    drawn_at: Option<Instant>,
    /// Whether a line was drawn that `finish` must end.
    drawn: bool,
}

impl ProgressBar {
    /// A bar on stderr, drawn only if stderr is a terminal.
    pub fn for_stderr() -> ProgressBar {
        ProgressBar {
            enabled: std::io::stderr().is_terminal(),
            started: Instant::now(),
            drawn_at: None,
            drawn: false,
        }
    }

    /// `done` of `total` bytes moved.
    pub fn update(&mut self, done: u64, total: u64) {
        if !self.enabled || total < LARGE_OBJECT_BYTES {
            return;
        }
        let now = Instant::now();
        let due = self
            .drawn_at
            .is_none_or(|drawn_at| now.duration_since(drawn_at) >= REDRAW_INTERVAL);
        if !due && done < total {
            return;
        }
        self.drawn_at = Some(now);
        self.drawn = true;
        let line = render(done, total, now.duration_since(self.started));
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r{line}");
        let _ = stderr.flush();
    }

    /// End the bar's line, so that what follows starts on a line of its own.
    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// One line of the bar: a gauge, the bytes, the percentage and the rate.
fn render(done: u64, total: u64, elapsed: Duration) -> String {
    const GAUGE_CELLS: u64 = 30;
    let fraction = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let filled = (fraction * GAUGE_CELLS as f64) as usize;
    let seconds = elapsed.as_secs_f64().max(1e-3);
    format!(
        "[{}{}] {:.1}/{:.1} MiB {:>3.0}% {:.1} MiB/s",
        "#".repeat(filled),
        " ".repeat(GAUGE_CELLS as usize - filled),
        done as f64 / MEBIBYTE_BYTES,
        total as f64 / MEBIBYTE_BYTES,
        fraction * 100.0,
        done as f64 / MEBIBYTE_BYTES / seconds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_bytes_percent_and_rate() {
        let line = render(64 << 20, 128 << 20, Duration::from_secs(2));
        assert_eq!(
            line,
            "[###############               ] 64.0/128.0 MiB  50% 32.0 MiB/s"
        );
        let done = render(10 << 20, 10 << 20, Duration::from_millis(500));
        assert!(
            done.contains("100%") && done.contains("20.0 MiB/s"),
            "{done}"
        );
    }
}
