//! A progress bar for long transfers on stderr (the `indicatif` crate): drawn at most twenty
//! times a second, and not at all when stderr is not a terminal or the object is small.

/// Objects smaller than this move in well under a second: no bar for them.
const LARGE_OBJECT_BYTES: u64 = 8 << 20;
/// A gauge, the bytes, the percentage and the rate: `[#####     ] 64 MiB/128 MiB 50% 32 MiB/s`.
const TEMPLATE: &str =
    "[{bar:30}] {binary_bytes}/{binary_total_bytes} {percent:>3}% {binary_bytes_per_sec}";

pub struct ProgressBar {
    /// Made at the first update of a large object.
    bar: Option<indicatif::ProgressBar>,
}

impl ProgressBar {
    /// A bar on stderr, drawn only if stderr is a terminal.
    pub fn for_stderr() -> ProgressBar {
        ProgressBar { bar: None }
    }

    /// `done` of `total` bytes moved.
    pub fn update(&mut self, done: u64, total: u64) {
        if total < LARGE_OBJECT_BYTES {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let style = indicatif::ProgressStyle::with_template(TEMPLATE)
                .expect("the template is valid")
                .progress_chars("## ");
            indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::stderr(),
            )
            .with_style(style)
        });
        bar.set_length(total);
        bar.set_position(done);
    }

    /// End the bar's line, so that what follows starts on a line of its own.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}
