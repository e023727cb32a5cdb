//! Line charts as SVG (the `plotters` crate), one line per series: miss ratio against cache
//! size, latency percentiles per run, throughput over time. SVG keeps the text as text, so a
//! browser or viewer draws the labels in a real font, and no font is needed to write them.

use std::path::Path;

use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
use plotters::prelude::*;

/// One line of the chart: a name for the legend and a y value per x label.
pub struct Series {
    pub name: String,
    pub points: Vec<f64>,
}

const WIDTH: u32 = 960;
const HEIGHT: u32 = 560;
/// Miss ratios are gridded to this step at the ends of the y axis.
const RATIO_STEP: f64 = 0.05;
/// Line colours, one per series in order (the common "category 10" palette).
const PALETTE: [RGBColor; 10] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// How the y axis maps values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// Values between 0 and 1 (miss ratios).
    Ratio,
    /// From 0 up (throughput).
    Linear,
    /// Powers of ten (latencies spanning microseconds to seconds).
    Logarithmic,
}

/// Axis titles and the y scale of a chart.
pub struct Axes<'a> {
    pub x_title: &'a str,
    pub y_title: &'a str,
    pub scale: Scale,
}

const MISS_RATIO_AXES: Axes<'static> = Axes {
    x_title: "cache size",
    y_title: "miss ratio",
    scale: Scale::Ratio,
};

/// Draws the miss-ratio chart and writes it to `path`.
pub fn write_line_chart(path: &Path, x_labels: &[String], series: &[Series]) -> Result<(), String> {
    write_chart(path, &MISS_RATIO_AXES, x_labels, series)
}

/// Draws a chart with `axes` and writes it to `path` as SVG.
pub fn write_chart(
    path: &Path,
    axes: &Axes,
    x_labels: &[String],
    series: &[Series],
) -> Result<(), String> {
    let svg = draw(axes, x_labels, series).map_err(|error| format!("drawing the plot: {error}"))?;
    std::fs::write(path, svg).map_err(|error| format!("{}: {error}", path.display()))
}

/// The y axis's ends for the values drawn.
fn y_range(scale: Scale, low: f64, high: f64) -> (f64, f64) {
    match scale {
        Scale::Ratio => {
            let min = ((low / RATIO_STEP).floor() * RATIO_STEP).max(0.0);
            let max = ((high / RATIO_STEP).ceil() * RATIO_STEP)
                .min(1.0)
                .max(min + RATIO_STEP);
            (min, max)
        }
        Scale::Linear => (0.0, (high * 1.05).max(1.0)),
        Scale::Logarithmic => {
            let min = low.max(f64::MIN_POSITIVE).log10().floor();
            let max = high.max(f64::MIN_POSITIVE).log10().ceil().max(min + 1.0);
            (10f64.powf(min), 10f64.powf(max))
        }
    }
}

/// The chart as an SVG document.
fn draw(
    axes: &Axes,
    x_labels: &[String],
    series: &[Series],
) -> Result<String, Box<dyn std::error::Error>> {
    let values = || {
        series
            .iter()
            .flat_map(|series| series.points.iter().copied())
            .filter(|value| value.is_finite())
    };
    let low = values().fold(f64::INFINITY, f64::min);
    let high = values().fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low <= high { (low, high) } else { (0.0, 1.0) };
    let (y_min, y_max) = y_range(axes.scale, low, high);
    let columns = x_labels.len().max(1);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70);
        let x = (0..columns).into_segmented();
        // The two scales give the chart different types; one body draws either.
        macro_rules! plot {
            ($y:expr) => {{
                let mut chart = builder.build_cartesian_2d(x, $y)?;
                chart
                    .configure_mesh()
                    .x_desc(axes.x_title)
                    .y_desc(axes.y_title)
                    .x_labels(columns.min(20))
                    .x_label_formatter(&|value| match value {
                        SegmentValue::CenterOf(index) => {
                            x_labels.get(*index).cloned().unwrap_or_default()
                        }
                        _ => String::new(),
                    })
                    .label_style(("sans-serif", 14))
                    .axis_desc_style(("sans-serif", 16))
                    .light_line_style(RGBColor(240, 240, 240))
                    .draw()?;
                for (index, line) in series.iter().enumerate() {
                    let colour = PALETTE[index % PALETTE.len()];
                    let points: Vec<(SegmentValue<usize>, f64)> = line
                        .points
                        .iter()
                        .enumerate()
                        .filter(|(_, value)| value.is_finite())
                        .map(|(column, &value)| (SegmentValue::CenterOf(column), value))
                        .collect();
                    chart
                        .draw_series(LineSeries::new(points.clone(), colour.stroke_width(3)))?
                        .label(line.name.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
                        });
                    chart.draw_series(
                        points
                            .into_iter()
                            .map(|point| Circle::new(point, 3, colour.filled())),
                    )?;
                }
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .label_font(("sans-serif", 14))
                    .position(SeriesLabelPosition::UpperRight)
                    .draw()?;
            }};
        }
        match axes.scale {
            Scale::Logarithmic => plot!((y_min..y_max).log_scale()),
            Scale::Ratio | Scale::Linear => plot!(y_min..y_max),
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_series() -> Vec<Series> {
        vec![
            Series {
                name: "lru".into(),
                points: vec![0.8, 0.7, 0.6],
            },
            Series {
                name: "sieve".into(),
                points: vec![0.7, 0.5, f64::NAN],
            },
        ]
    }

    #[test]
    fn ratio_ranges_are_gridded_and_log_ranges_span_powers_of_ten() {
        let close = |(low, high): (f64, f64), (want_low, want_high): (f64, f64)| {
            (low - want_low).abs() < 1e-9 && (high - want_high).abs() < 1e-9
        };
        assert!(close(y_range(Scale::Ratio, 0.42, 0.81), (0.4, 0.85)));
        assert!(close(y_range(Scale::Ratio, 0.0, 1.0), (0.0, 1.0)));
        assert!(close(
            y_range(Scale::Logarithmic, 42.0, 15_000.0),
            (10.0, 100_000.0)
        ));
        assert!(close(y_range(Scale::Linear, 10.0, 1_000.0), (0.0, 1_050.0)));
    }

    #[test]
    fn the_chart_names_its_series_axes_and_labels_and_draws_a_line_each() {
        let labels = ["10", "100", "1000"].map(String::from);
        for axes in [
            MISS_RATIO_AXES,
            Axes {
                x_title: "percentile",
                y_title: "latency us (log scale)",
                scale: Scale::Logarithmic,
            },
        ] {
            let svg = draw(&axes, &labels, &two_series()).expect("drawn");
            assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
            // SVG text elements hold their text on a line of its own.
            for text in ["lru", "sieve", "1000", axes.x_title, axes.y_title] {
                assert!(svg.contains(&format!(">\n{text}\n</text>")), "{text}");
            }
            // A line per series and a mark in the legend, in its colour.
            for colour in ["#D62728", "#FF7F0E"] {
                let line = format!("stroke=\"{colour}\" stroke-width=\"3\"");
                assert_eq!(svg.matches(&line).count(), 2, "{colour}");
            }
            // A marker per point; the NaN point is left out.
            assert_eq!(svg.matches("<circle").count(), 3 + 2);
        }
    }

    #[test]
    fn a_chart_is_written_to_its_file() {
        let path = std::env::temp_dir().join(format!("hydrant-plot-{}.svg", std::process::id()));
        let labels = ["a", "b", "c"].map(String::from);
        write_line_chart(&path, &labels, &two_series()).expect("written");
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(written.starts_with("<svg") && written.trim_end().ends_with("</svg>"));
    }
}
