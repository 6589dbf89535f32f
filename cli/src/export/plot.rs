//! `report --plot FILE.svg`: the pictures people put in reports. Top: the
//! latency distribution by percentile ("nines" on the x axis: p90, p99,
//! p99.9…), one line per role and metric; bottom: p99 over time per interval.

use std::path::Path;

use anyhow::{Result, anyhow, bail};
use hdrhistogram::Histogram;
use plotters::prelude::*;

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

pub fn svg(path: &Path, series: &[Series]) -> Result<()> {
    if series.is_empty() {
        bail!("nothing to plot");
    }
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
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

    #[test]
    fn the_svg_holds_both_plots_with_a_line_per_series() {
        let dir = std::env::temp_dir().join(format!("sp-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.svg");
        let series = vec![
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
        ];
        svg(&path, &series).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
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
        assert!(svg(&std::env::temp_dir().join("x.svg"), &[]).is_err());
    }
}
