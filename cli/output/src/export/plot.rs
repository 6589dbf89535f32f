//! `report --plot FILE.svg|FILE.png`: the pictures people put in reports.
//! Top: the latency distribution by percentile ("nines" on the x axis: p90,
//! p99, p99.9…), one line per role and metric; bottom: p99 over time per
//! interval.

use std::{
    path::Path,
    sync::{Mutex, OnceLock},
};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use plotters::{
    coord::Shift,
    prelude::*,
    style::{FontStyle, register_font},
};

/// One role and metric to draw.
pub struct Series {
    pub label: String,
    /// The whole run (or window), merged.
    pub total: Histogram<u64>,
    /// (seconds since the recording started, p99 in ns) per interval.
    pub p99_over_time: Vec<(f64, u64)>,
}

/// Points drawn per line, evenly spaced in "nines": x = -log10(1 - q),
/// from p0 (x = 0) to p99.99 (x = 4).
const POINTS: u32 = 81;

fn nines_label(x: f64) -> String {
    match x.round() as i32 {
        0 => "p0".into(),
        1 => "p90".into(),
        2 => "p99".into(),
        3 => "p99.9".into(),
        _ => "p99.99".into(),
    }
}

/// TrueType fonts tried in order: both backends need one to measure labels,
/// and the PNG one to draw them. Debian's fonts-dejavu-core is installed by
/// `cargo xtask setup`.
const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Loads the first font found once per process; plotters keeps a `'static`
/// reference to it, so the bytes are leaked on purpose (a few hundred KiB).
fn load_font() -> Result<()> {
    static LOADED: OnceLock<()> = OnceLock::new();
    static LOADING: Mutex<()> = Mutex::new(());
    let _guard = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if LOADED.get().is_some() {
        return Ok(());
    }
    let path = FONTS
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| {
            anyhow!(
                "plotting needs a TrueType font and none of {} exists; \
                 install one (Debian: apt install fonts-dejavu-core)",
                FONTS.join(", ")
            )
        })?;
    let bytes: &'static [u8] =
        Vec::leak(std::fs::read(path).with_context(|| format!("reading {path}"))?);
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{path} is not a TrueType font plotters can read"))?;
    let _ = LOADED.set(());
    Ok(())
}

/// Draws into `path`, an SVG or PNG file chosen by its extension, created
/// as `export::file` creates files (an existing one only with `force`).
pub fn write(path: &Path, force: bool, series: &[Series]) -> Result<()> {
    if series.is_empty() {
        bail!("nothing to plot");
    }
    let (width, height) = (1000u32, 800u32);
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    load_font()?;
    // Drawn in memory, so the file is opened only by us, safely.
    let drawing = || format!("drawing {}", path.display());
    let bytes = match extension.as_deref() {
        Some("svg") => {
            let mut svg = String::new();
            draw(
                SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area(),
                series,
            )
            .with_context(drawing)?;
            svg.into_bytes()
        }
        Some("png") => {
            let mut rgb = vec![0u8; (width * height * 3) as usize];
            draw(
                BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area(),
                series,
            )
            .with_context(drawing)?;
            let mut png_bytes = Vec::new();
            let mut encoder = png::Encoder::new(&mut png_bytes, width, height);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder
                .write_header()
                .and_then(|mut w| w.write_image_data(&rgb))
                .with_context(drawing)?;
            png_bytes
        }
        _ => bail!(
            "{}: --plot writes .svg or .png files; name the file with one of those extensions",
            path.display()
        ),
    };
    let mut file = super::file::create(path, force, "plot")?;
    std::io::Write::write_all(&mut file, &bytes)
        .with_context(|| format!("writing {}", path.display()))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, series: &[Series]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(400);
    let us = |ns: u64| (ns.max(1) as f64) / 1e3;
    let max_us = series.iter().map(|s| us(s.total.max())).fold(1.0, f64::max) * 1.2;
    let min_us = series
        .iter()
        .map(|s| us(s.total.min()))
        .fold(f64::MAX, f64::min)
        .max(0.01)
        / 1.2;

    let mut dist = ChartBuilder::on(&top)
        .caption("latency by percentile", ("sans-serif", 20))
        .margin(10)
        .margin_right(40)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..4f64, (min_us..max_us).log_scale())
        .map_err(err)?;
    dist.configure_mesh()
        .x_desc("percentile")
        .y_desc("µs")
        .x_labels(5)
        .x_label_formatter(&|x| nines_label(*x))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = (0..POINTS).map(|i| {
            let x = 4.0 * f64::from(i) / f64::from(POINTS - 1);
            (x, us(s.total.value_at_quantile(1.0 - 10f64.powf(-x))))
        });
        dist.draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    dist.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    let end = series
        .iter()
        .flat_map(|s| s.p99_over_time.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let max_p99 = series
        .iter()
        .flat_map(|s| s.p99_over_time.iter().map(|p| us(p.1)))
        .fold(1.0, f64::max)
        * 1.2;
    let mut time = ChartBuilder::on(&bottom)
        .caption("p99 over time", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..end, 0f64..max_p99)
        .map_err(err)?;
    time.configure_mesh()
        .x_desc("seconds")
        .y_desc("p99 µs")
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        time.draw_series(LineSeries::new(
            s.p99_over_time.iter().map(|&(t, p)| (t, us(p))),
            color.stroke_width(2),
        ))
        .map_err(err)?
        .label(s.label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    time.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for v in values {
            h.record(v).unwrap();
        }
        h
    }

    fn two_series() -> Vec<Series> {
        vec![
            Series {
                label: "postgres postmaster · fork".into(),
                total: hist((1..=1000).map(|v| v * 100)),
                p99_over_time: vec![(0.0, 90_000), (1.0, 95_000), (2.0, 99_000)],
            },
            Series {
                label: "nginx worker · accept".into(),
                total: hist((1..=1000).map(|v| v * 10)),
                p99_over_time: vec![(0.0, 9_000), (1.0, 9_500)],
            },
        ]
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sp-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn the_svg_holds_both_plots_with_a_line_per_series() {
        let path = scratch("p.svg");
        write(&path, false, &two_series()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
        assert!(text.trim_end().ends_with("</svg>"));
        for label in [
            "latency by percentile",
            "p99 over time",
            "postgres postmaster · fork",
            "nginx worker · accept",
        ] {
            assert!(text.contains(label), "missing {label}");
        }
        // Two series in each plot (plus two legend strokes each).
        let lines = text.matches("<polyline").count();
        assert!(lines >= 4, "{lines} polylines");
        assert!(write(&std::env::temp_dir().join("x.svg"), false, &[]).is_err());
    }

    #[test]
    fn the_png_is_a_1000_by_800_picture_with_each_series_colour() {
        let path = scratch("p.png");
        write(&path, false, &two_series()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let frame = reader.next_frame(&mut pixels).unwrap();
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        assert_eq!((frame.width, frame.height), (1000, 800));
        assert_eq!(frame.color_type, png::ColorType::Rgb);
        let rgb: Vec<&[u8]> = pixels[..frame.buffer_size()].chunks(3).collect();
        let count = |(r, g, b): (u8, u8, u8)| rgb.iter().filter(|p| **p == [r, g, b]).count();
        // Each line is drawn 2 px wide in its palette colour; text is black.
        for i in 0..2 {
            let n = count(Palette99::pick(i).to_rgba().rgb());
            assert!(n > 500, "series {i}: {n} pixels of its colour");
        }
        assert!(count(BLACK.rgb()) > 1000, "labels and axes are drawn");
    }

    #[test]
    fn other_extensions_are_refused_with_the_file_name() {
        let err = write(Path::new("/tmp/out.jpg"), false, &two_series()).unwrap_err();
        assert!(format!("{err:#}").contains("/tmp/out.jpg"), "{err:#}");
        assert!(!Path::new("/tmp/out.jpg").exists());
    }
}
