//! A small line chart written as a PNG, one line per series: miss ratio against cache size, latency
//! percentiles per run, throughput over time.
//!
//! Written here instead of pulling in a plotting crate: an RGB canvas, straight lines, a 3×5 pixel
//! font for the labels, and a PNG encoder of a few chunks (zlib and CRC-32 from flate2, which the
//! trace reader needs anyway).

use std::io::Write;
use std::path::Path;

/// One line of the chart: a name for the legend and a y value per x label.
pub struct Series {
    pub name: String,
    pub points: Vec<f64>,
}

const WIDTH: usize = 960;
const HEIGHT: usize = 560;
const MARGIN_LEFT: usize = 90;
const MARGIN_RIGHT: usize = 170;
const MARGIN_TOP: usize = 50;
const MARGIN_BOTTOM: usize = 70;
/// Font glyphs are 3×5 cells drawn at this many pixels per cell.
const FONT_SCALE: usize = 2;
const GLYPH_ADVANCE_PIXELS: usize = 4 * FONT_SCALE;
const LINE_THICKNESS_PIXELS: i64 = 3;
const MARKER_PIXELS: i64 = 7;
/// Horizontal grid lines are this far apart in miss ratio, or twice that on a tall range.
const GRID_STEP: f64 = 0.05;

const WHITE: [u8; 3] = [255, 255, 255];
const BLACK: [u8; 3] = [0, 0, 0];
const GRID: [u8; 3] = [225, 225, 225];
/// Line colours, one per series in order (the common "category 10" palette).
const PALETTE: [[u8; 3]; 10] = [
    [214, 39, 40],
    [255, 127, 14],
    [31, 119, 180],
    [44, 160, 44],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

/// How the y axis maps values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// Values between 0 and 1, gridded every `GRID_STEP` (miss ratios).
    Ratio,
    /// From 0 up, gridded at a round step (throughput).
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
/// Linear axes aim for about this many grid lines.
const LINEAR_GRID_LINES: f64 = 8.0;

/// Draws the miss-ratio chart and writes it to `path`.
pub fn write_line_chart(path: &Path, x_labels: &[String], series: &[Series]) -> Result<(), String> {
    write_chart(path, &MISS_RATIO_AXES, x_labels, series)
}

/// Draws a chart with `axes` and writes it to `path`.
pub fn write_chart(
    path: &Path,
    axes: &Axes,
    x_labels: &[String],
    series: &[Series],
) -> Result<(), String> {
    let canvas = draw(axes, x_labels, series);
    let png = encode_png(&canvas).map_err(|error| format!("encoding the plot: {error}"))?;
    std::fs::write(path, png).map_err(|error| format!("{}: {error}", path.display()))
}

struct Canvas {
    pixels: Vec<[u8; 3]>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            pixels: vec![WHITE; WIDTH * HEIGHT],
        }
    }

    fn set(&mut self, x: i64, y: i64, colour: [u8; 3]) {
        if (0..WIDTH as i64).contains(&x) && (0..HEIGHT as i64).contains(&y) {
            self.pixels[y as usize * WIDTH + x as usize] = colour;
        }
    }

    fn square(&mut self, x: i64, y: i64, side: i64, colour: [u8; 3]) {
        for dy in 0..side {
            for dx in 0..side {
                self.set(x - side / 2 + dx, y - side / 2 + dy, colour);
            }
        }
    }

    /// A straight line (Bresenham's), `thickness` pixels wide.
    fn line(&mut self, from: (i64, i64), to: (i64, i64), thickness: i64, colour: [u8; 3]) {
        let (mut x, mut y) = from;
        let dx = (to.0 - x).abs();
        let dy = -(to.1 - y).abs();
        let step_x = if x < to.0 { 1 } else { -1 };
        let step_y = if y < to.1 { 1 } else { -1 };
        let mut error = dx + dy;
        loop {
            self.square(x, y, thickness, colour);
            if (x, y) == to {
                return;
            }
            let doubled = 2 * error;
            if doubled >= dy {
                error += dy;
                x += step_x;
            }
            if doubled <= dx {
                error += dx;
                y += step_y;
            }
        }
    }

    fn text(&mut self, x: usize, y: usize, text: &str, colour: [u8; 3]) {
        for (index, character) in text.chars().enumerate() {
            let rows = glyph(character);
            let left = x + index * GLYPH_ADVANCE_PIXELS;
            for (row, bits) in rows.iter().enumerate() {
                for column in 0..3 {
                    if bits & (0b100 >> column) != 0 {
                        for dy in 0..FONT_SCALE {
                            for dx in 0..FONT_SCALE {
                                self.set(
                                    (left + column * FONT_SCALE + dx) as i64,
                                    (y + row * FONT_SCALE + dy) as i64,
                                    colour,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_width(text: &str) -> usize {
    text.chars().count() * GLYPH_ADVANCE_PIXELS
}

fn draw(axes: &Axes, x_labels: &[String], series: &[Series]) -> Canvas {
    let mut canvas = Canvas::new();
    let plot_left = MARGIN_LEFT;
    let plot_right = WIDTH - MARGIN_RIGHT;
    let plot_top = MARGIN_TOP;
    let plot_bottom = HEIGHT - MARGIN_BOTTOM;

    let values = series.iter().flat_map(|line| line.points.iter().copied());
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(low, high), value| {
        (low.min(value), high.max(value))
    });
    let (low, high) = if low > high { (0.0, 1.0) } else { (low, high) };
    let range = YRange::of(axes.scale, low, high);
    let (y_min, y_max) = (range.min, range.max);
    let y_of = |value: f64| -> i64 {
        let fraction = (range.position(value) - y_min) / (y_max - y_min);
        plot_bottom as i64 - (fraction * (plot_bottom - plot_top) as f64).round() as i64
    };
    let points = x_labels.len().max(1);
    let x_of = |index: usize| -> i64 {
        if points == 1 {
            ((plot_left + plot_right) / 2) as i64
        } else {
            (plot_left + index * (plot_right - plot_left) / (points - 1)) as i64
        }
    };

    // Grid and y labels; ticks are in the range's own units (exponents on a log scale).
    let mut tick = y_min;
    while tick <= y_max + 1e-9 {
        let value = range.value(tick);
        let y = y_of(value);
        canvas.line((plot_left as i64, y), (plot_right as i64, y), 1, GRID);
        let label = range.label(value);
        canvas.text(
            plot_left - text_width(&label) - 8,
            (y as usize).saturating_sub(5),
            &label,
            BLACK,
        );
        tick += range.step;
    }
    // Axes.
    canvas.line(
        (plot_left as i64, plot_top as i64),
        (plot_left as i64, plot_bottom as i64),
        1,
        BLACK,
    );
    canvas.line(
        (plot_left as i64, plot_bottom as i64),
        (plot_right as i64, plot_bottom as i64),
        1,
        BLACK,
    );
    // X labels, every `label_every`-th one when drawing all would make them overlap.
    let label_width = x_labels
        .iter()
        .map(|label| text_width(label))
        .max()
        .unwrap_or(0);
    let label_every = ((label_width + GLYPH_ADVANCE_PIXELS) * points)
        .div_ceil(plot_right - plot_left)
        .max(1);
    for (index, label) in x_labels.iter().enumerate() {
        if index % label_every != 0 {
            continue;
        }
        let x = x_of(index) as usize;
        canvas.line(
            (x as i64, plot_bottom as i64),
            (x as i64, plot_bottom as i64 + 5),
            1,
            BLACK,
        );
        canvas.text(
            x.saturating_sub(text_width(label) / 2),
            plot_bottom + 12,
            label,
            BLACK,
        );
    }
    canvas.text(
        (plot_left + plot_right - text_width(axes.x_title)) / 2,
        HEIGHT - 30,
        axes.x_title,
        BLACK,
    );
    canvas.text(plot_left, plot_top - 30, axes.y_title, BLACK);

    // Lines, markers and the legend.
    for (number, line) in series.iter().enumerate() {
        let colour = PALETTE[number % PALETTE.len()];
        let coordinates: Vec<(i64, i64)> = line
            .points
            .iter()
            .enumerate()
            .map(|(index, &value)| (x_of(index), y_of(value)))
            .collect();
        for pair in coordinates.windows(2) {
            canvas.line(pair[0], pair[1], LINE_THICKNESS_PIXELS, colour);
        }
        // Markers only where they stay apart; a dense series is a line.
        if coordinates.len() * MARKER_PIXELS as usize * 2 <= plot_right - plot_left {
            for &(x, y) in &coordinates {
                canvas.square(x, y, MARKER_PIXELS, colour);
            }
        }
        let legend_y = plot_top + 10 + number * 24;
        canvas.line(
            (plot_right as i64 + 20, legend_y as i64 + 5),
            (plot_right as i64 + 50, legend_y as i64 + 5),
            LINE_THICKNESS_PIXELS,
            colour,
        );
        canvas.text(plot_right + 58, legend_y, &line.name, BLACK);
    }
    canvas
}

/// The y axis's extent in its own units (values, or exponents of ten on a log scale), and the
/// step between grid lines.
struct YRange {
    scale: Scale,
    min: f64,
    max: f64,
    step: f64,
}

impl YRange {
    fn of(scale: Scale, low: f64, high: f64) -> YRange {
        match scale {
            Scale::Ratio => {
                let min = ((low / GRID_STEP).floor() * GRID_STEP).max(0.0);
                let max = ((high / GRID_STEP).ceil() * GRID_STEP)
                    .min(1.0)
                    .max(min + GRID_STEP);
                let step = if (max - min) / GRID_STEP > 12.0 {
                    GRID_STEP * 2.0
                } else {
                    GRID_STEP
                };
                YRange {
                    scale,
                    min,
                    max,
                    step,
                }
            }
            Scale::Linear => {
                let step = round_step(high.max(f64::MIN_POSITIVE) / LINEAR_GRID_LINES);
                YRange {
                    scale,
                    min: 0.0,
                    max: ((high / step).ceil() * step).max(step),
                    step,
                }
            }
            Scale::Logarithmic => {
                let min = low.max(f64::MIN_POSITIVE).log10().floor();
                let max = high.max(f64::MIN_POSITIVE).log10().ceil().max(min + 1.0);
                YRange {
                    scale,
                    min,
                    max,
                    step: 1.0,
                }
            }
        }
    }

    /// A value's position on the axis, in the range's units.
    fn position(&self, value: f64) -> f64 {
        match self.scale {
            Scale::Logarithmic => value.max(f64::MIN_POSITIVE).log10(),
            Scale::Ratio | Scale::Linear => value,
        }
    }

    /// The value at a position on the axis.
    fn value(&self, position: f64) -> f64 {
        match self.scale {
            Scale::Logarithmic => 10f64.powf(position),
            Scale::Ratio | Scale::Linear => position,
        }
    }

    fn label(&self, value: f64) -> String {
        match self.scale {
            Scale::Ratio => format!("{value:.2}"),
            Scale::Linear if self.step >= 1.0 => format!("{value:.0}"),
            Scale::Linear => format!("{value:.2}"),
            Scale::Logarithmic if value >= 1.0 => format!("{value:.0}"),
            Scale::Logarithmic => format!("{value}"),
        }
    }
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
fn round_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|&step| step >= raw)
        .unwrap_or(10.0 * power)
}

/// A 3×5 glyph, one row per entry, the leftmost cell in bit 2. Letters have one (capital) shape
/// for both cases; characters without a glyph draw as a blank.
fn glyph(character: char) -> [u8; 5] {
    match character.to_ascii_uppercase() {
        '0' => [0b111, 0b101, 0b101, 0b101, 0b111],
        '1' => [0b010, 0b110, 0b010, 0b010, 0b111],
        '2' => [0b111, 0b001, 0b111, 0b100, 0b111],
        '3' => [0b111, 0b001, 0b111, 0b001, 0b111],
        '4' => [0b101, 0b101, 0b111, 0b001, 0b001],
        '5' => [0b111, 0b100, 0b111, 0b001, 0b111],
        '6' => [0b111, 0b100, 0b111, 0b101, 0b111],
        '7' => [0b111, 0b001, 0b001, 0b001, 0b001],
        '8' => [0b111, 0b101, 0b111, 0b101, 0b111],
        '9' => [0b111, 0b101, 0b111, 0b001, 0b111],
        '.' => [0b000, 0b000, 0b000, 0b000, 0b010],
        ',' => [0b000, 0b000, 0b000, 0b010, 0b100],
        ':' => [0b000, 0b010, 0b000, 0b010, 0b000],
        '%' => [0b101, 0b001, 0b010, 0b100, 0b101],
        '-' => [0b000, 0b000, 0b111, 0b000, 0b000],
        '/' => [0b001, 0b001, 0b010, 0b100, 0b100],
        '_' => [0b000, 0b000, 0b000, 0b000, 0b111],
        '(' => [0b010, 0b100, 0b100, 0b100, 0b010],
        ')' => [0b010, 0b001, 0b001, 0b001, 0b010],
        'A' => [0b010, 0b101, 0b111, 0b101, 0b101],
        'B' => [0b110, 0b101, 0b110, 0b101, 0b110],
        'C' => [0b011, 0b100, 0b100, 0b100, 0b011],
        'D' => [0b110, 0b101, 0b101, 0b101, 0b110],
        'E' => [0b111, 0b100, 0b110, 0b100, 0b111],
        'F' => [0b111, 0b100, 0b110, 0b100, 0b100],
        'G' => [0b011, 0b100, 0b101, 0b101, 0b011],
        'H' => [0b101, 0b101, 0b111, 0b101, 0b101],
        'I' => [0b111, 0b010, 0b010, 0b010, 0b111],
        'J' => [0b001, 0b001, 0b001, 0b101, 0b010],
        'K' => [0b101, 0b101, 0b110, 0b101, 0b101],
        'L' => [0b100, 0b100, 0b100, 0b100, 0b111],
        'M' => [0b101, 0b111, 0b111, 0b101, 0b101],
        'N' => [0b110, 0b101, 0b101, 0b101, 0b101],
        'O' => [0b010, 0b101, 0b101, 0b101, 0b010],
        'P' => [0b110, 0b101, 0b110, 0b100, 0b100],
        'Q' => [0b010, 0b101, 0b101, 0b110, 0b011],
        'R' => [0b110, 0b101, 0b110, 0b101, 0b101],
        'S' => [0b011, 0b100, 0b010, 0b001, 0b110],
        'T' => [0b111, 0b010, 0b010, 0b010, 0b010],
        'U' => [0b101, 0b101, 0b101, 0b101, 0b111],
        'V' => [0b101, 0b101, 0b101, 0b101, 0b010],
        'W' => [0b101, 0b101, 0b111, 0b111, 0b101],
        'X' => [0b101, 0b101, 0b010, 0b101, 0b101],
        'Y' => [0b101, 0b101, 0b010, 0b010, 0b010],
        'Z' => [0b111, 0b001, 0b010, 0b100, 0b111],
        _ => [0; 5],
    }
}

/// PNG file signature (PNG specification, 5.2).
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
/// IHDR: 8 bits per sample, colour type 2 (RGB), deflate, adaptive filtering, no interlace.
const BIT_DEPTH: u8 = 8;
const COLOUR_TYPE_RGB: u8 = 2;
/// Each scanline starts with its filter type; 0 is "none".
const FILTER_NONE: u8 = 0;

fn encode_png(canvas: &Canvas) -> std::io::Result<Vec<u8>> {
    let mut png = PNG_SIGNATURE.to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&(WIDTH as u32).to_be_bytes());
    header.extend_from_slice(&(HEIGHT as u32).to_be_bytes());
    header.extend_from_slice(&[BIT_DEPTH, COLOUR_TYPE_RGB, 0, 0, 0]);
    write_chunk(&mut png, b"IHDR", &header);

    let mut scanlines = Vec::with_capacity(HEIGHT * (1 + WIDTH * 3));
    for row in canvas.pixels.chunks_exact(WIDTH) {
        scanlines.push(FILTER_NONE);
        scanlines.extend(row.iter().flatten());
    }
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(&scanlines)?;
    write_chunk(&mut png, b"IDAT", &encoder.finish()?);
    write_chunk(&mut png, b"IEND", &[]);
    Ok(png)
}

/// A chunk: length, type, data, and the CRC-32 of type and data.
fn write_chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    png.extend_from_slice(&crc.sum().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn linear_steps_are_round_and_cover_the_values() {
        assert_eq!(round_step(0.7), 1.0);
        assert_eq!(round_step(1.3), 2.0);
        assert_eq!(round_step(3.0), 5.0);
        assert_eq!(round_step(1_234.0), 2_000.0);
        let range = YRange::of(Scale::Linear, 10.0, 95_000.0);
        assert_eq!(
            (range.min, range.step, range.max),
            (0.0, 20_000.0, 100_000.0)
        );
    }

    #[test]
    fn logarithmic_ranges_span_whole_powers_of_ten() {
        let range = YRange::of(Scale::Logarithmic, 42.0, 15_000.0);
        assert_eq!((range.min, range.max, range.step), (1.0, 5.0, 1.0));
        assert_eq!(range.label(range.value(2.0)), "100");
        assert!((range.position(1_000.0) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_png_decodes_to_the_canvas() {
        let series = vec![
            Series {
                name: "lru".into(),
                points: vec![0.8, 0.7, 0.6],
            },
            Series {
                name: "sieve".into(),
                points: vec![0.7, 0.5, 0.45],
            },
        ];
        let labels = ["10", "100", "1000"].map(String::from);
        let canvas = draw(&MISS_RATIO_AXES, &labels, &series);
        let png = encode_png(&canvas).expect("encode");
        assert_eq!(&png[..8], &PNG_SIGNATURE);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(
            u32::from_be_bytes(png[16..20].try_into().unwrap()),
            WIDTH as u32
        );
        // Walk the chunks, checking each CRC, and inflate IDAT back to the scanlines.
        let mut offset = 8;
        let mut compressed = Vec::new();
        while offset < png.len() {
            let length = u32::from_be_bytes(png[offset..offset + 4].try_into().unwrap()) as usize;
            let kind = &png[offset + 4..offset + 8];
            let data = &png[offset + 8..offset + 8 + length];
            let mut crc = flate2::Crc::new();
            crc.update(kind);
            crc.update(data);
            let stored = &png[offset + 8 + length..offset + 12 + length];
            assert_eq!(stored, crc.sum().to_be_bytes());
            if kind == b"IDAT" {
                compressed.extend_from_slice(data);
            }
            offset += 12 + length;
        }
        let mut scanlines = Vec::new();
        flate2::read::ZlibDecoder::new(&compressed[..])
            .read_to_end(&mut scanlines)
            .expect("inflate");
        assert_eq!(scanlines.len(), HEIGHT * (1 + WIDTH * 3));
        // Both series' colours are on the canvas.
        for colour in &PALETTE[..2] {
            assert!(canvas.pixels.contains(colour));
        }
    }
}
