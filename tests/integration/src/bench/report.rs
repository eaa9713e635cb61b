//! The bench's output: a Markdown report for the terminal, the records as
//! JSON, and SVG plots of each metric against the number of Services.
//!
//! Every ratio is "this median over the reference's median" for the same
//! metric, N and M: `×r` against `direct` (the cost of any dataplane at all),
//! `÷ipt r` against `iptables-legacy` (what kube-proxy users run today).
use std::fmt::{self, Write as _};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::record::{DIRECT, Record};

/// The label of kube-proxy's default mode, the `÷ipt` baseline.
const IPT_LEGACY: &str = "iptables-legacy";

/// One SVG plot: `metric`'s median against N.
#[derive(Clone, Copy, Debug)]
pub struct Plot {
    /// File name inside the output directory, e.g. `crr_rate.svg`.
    pub file: &'static str,
    pub title: &'static str,
    pub metric: &'static str,
    pub y_label: &'static str,
    pub log_y: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot create the plot directory {}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot draw the plot {}", file.display())]
    Draw {
        file: PathBuf,
        #[source]
        source: DrawingAreaErrorKind<io::Error>,
    },
    #[error("cannot write the plot {}", file.display())]
    Write {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The Markdown report: a table per metric and unit (first-seen order), a row
/// per (N, M), a column per dataplane label (first-seen order), `—` where
/// nothing was measured, then `notes` as bullets. Should a combination be
/// recorded twice, the first record counts.
pub fn markdown(title: &str, records: &[Record], notes: &[String]) -> String {
    let mut out = String::new();
    render_markdown(&mut out, title, records, notes).expect("writing to a String cannot fail");
    out
}

fn render_markdown(
    out: &mut String,
    title: &str,
    records: &[Record],
    notes: &[String],
) -> fmt::Result {
    writeln!(out, "# {title}\n")?;
    if records.is_empty() {
        writeln!(out, "No measurements.\n")?;
    } else {
        writeln!(
            out,
            "Cells: median (min–max) over the repetitions. `×r`: the median over \
             `{DIRECT}`'s, `÷ipt r`: over `{IPT_LEGACY}`'s, at the same N and M.\n"
        )?;
    }
    // A metric recorded in two units gets two tables: its numbers would not
    // compare, nor divide into ratios.
    let tables = first_seen(records.iter().map(|r| (&r.metric, &r.unit)));
    for (metric, unit) in tables {
        let of: Vec<&Record> = records
            .iter()
            .filter(|r| (&r.metric, &r.unit) == (metric, unit))
            .collect();
        table(out, metric, unit, &of)?;
    }
    if !notes.is_empty() {
        writeln!(out, "## Notes\n")?;
        for note in notes {
            writeln!(out, "- {note}")?;
        }
    }
    Ok(())
}

fn table(out: &mut String, metric: &str, unit: &str, records: &[&Record]) -> fmt::Result {
    // Labels are computed once: they allocate, and every cell looks them up.
    let labelled: Vec<(String, &Record)> = records.iter().map(|r| (r.label(), *r)).collect();
    let labels = first_seen(labelled.iter().map(|(l, _)| l.as_str()));
    let mut rows = first_seen(records.iter().map(|r| (r.services, r.endpoints)));
    rows.sort_unstable();
    let shown_unit = if unit == "us" { "µs" } else { unit };
    let head: String = labels.iter().map(|l| format!(" {l} |")).collect();
    let align = "---:|".repeat(labels.len());
    writeln!(
        out,
        "## {metric} ({shown_unit})\n\n| N | M |{head}\n|---:|---:|{align}"
    )?;
    for (n, m) in rows {
        let find = |label: &str| {
            labelled
                .iter()
                .find(|(l, r)| l == label && r.services == n && r.endpoints == m)
                .map(|(_, r)| *r)
        };
        let direct = find(DIRECT);
        let base = find(IPT_LEGACY);
        let (n_text, m_text) = (group(f64::from(n), 0), group(f64::from(m), 0));
        write!(out, "| {n_text} | {m_text} |")?;
        for label in &labels {
            match find(label) {
                Some(r) => {
                    let direct = direct.filter(|_| *label != DIRECT);
                    let base = base.filter(|_| *label != IPT_LEGACY);
                    write!(out, " {} |", cell(r, unit, direct, base))?;
                }
                None => write!(out, " — |")?,
            }
        }
        writeln!(out)?;
    }
    writeln!(out)
}

/// `median (min–max) ×direct ÷ipt iptables-legacy`; the range is left out when
/// it would read `(x–x)`, as with a single repetition.
fn cell(r: &Record, unit: &str, direct: Option<&Record>, base: Option<&Record>) -> String {
    let median = fmt_value(r.median, unit);
    let (lo, hi) = (fmt_value(r.min, unit), fmt_value(r.max, unit));
    let mut s = if lo == hi {
        median
    } else {
        format!("{median} ({lo}–{hi})")
    };
    if let Some(q) = direct.and_then(|d| ratio(r.median, d.median)) {
        s.push_str(" ×");
        s.push_str(&q);
    }
    if let Some(q) = base.and_then(|b| ratio(r.median, b.median)) {
        s.push_str(" ÷ipt ");
        s.push_str(&q);
    }
    s
}

/// Items in the order they first appear. Quadratic, which is fine for the
/// dozens of labels and sizes a bench run has.
fn first_seen<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// Rates of a hundred or more show whole numbers (a fraction of a connection
/// per second is noise); small rates such as `Gbit/s` keep their decimals.
fn fmt_value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    let decimals = if unit.ends_with("/s") {
        if v.abs() >= 100.0 { 0 } else { sig_decimals(v) }
    } else if matches!(unit, "ns" | "us" | "µs" | "ms" | "s") || v.fract() != 0.0 {
        sig_decimals(v)
    } else {
        0
    };
    group(v, decimals)
}

/// About three significant digits, never fewer than one decimal: enough to
/// tell repetitions apart without printing the timer's noise.
fn sig_decimals(v: f64) -> usize {
    match v.abs() {
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    }
}

fn ratio(value: f64, reference: f64) -> Option<String> {
    let q = value / reference;
    if !q.is_finite() {
        return None;
    }
    Some(match q.abs() {
        a if a >= 100.0 => format!("{q:.0}"),
        a if a >= 10.0 => format!("{q:.1}"),
        a if a >= 0.1 => format!("{q:.2}"),
        _ => format!("{q:.3}"),
    })
}

/// `v` with `decimals` decimals and commas between thousands.
fn group(v: f64, decimals: usize) -> String {
    let digits = format!("{:.*}", decimals, v.abs());
    let (int, frac) = digits.split_once('.').unwrap_or((&digits, ""));
    let mut out = String::new();
    // No sign for values that round to zero: "-0.0" reads as a measurement.
    if v.is_sign_negative() && digits.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        out.push('-');
    }
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// `records` as a pretty-printed JSON array, exactly as serde writes `Record`.
pub fn write_json(path: &Path, records: &[Record]) -> io::Result<()> {
    let mut text = serde_json::to_string_pretty(records)?;
    text.push('\n');
    fs::write(path, text)
}

const SIZE: (u32, u32) = (800, 500);
const LEGEND_WIDTH: u32 = 170;

/// One line of a plot.
struct Series {
    key: String,
    color: RGBColor,
    points: Vec<Point>,
}

struct Point {
    services: u32,
    median: f64,
    lo: f64,
    hi: f64,
}

/// Writes each plot whose metric has drawable records into `dir` (created if
/// missing) and returns the files written. A log axis cannot show N = 0 or a
/// value ≤ 0, nor any axis a NaN (a size without samples): such points are
/// left out of the plot, the Markdown report still shows them.
pub fn write_svgs(
    dir: &Path,
    records: &[Record],
    plots: &[Plot],
) -> Result<Vec<PathBuf>, ReportError> {
    // One colour per label across all plots of a run, so lines can be compared.
    let labels = first_seen(records.iter().map(Record::label));
    let mut written = Vec::new();
    for plot in plots {
        let series = series(records, plot, &labels);
        if series.is_empty() {
            continue;
        }
        fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let file = dir.join(plot.file);
        // Rendered into memory, so that a failed write is reported rather than
        // lost in the backend's drop.
        let svg = render(plot, &series).map_err(|source| ReportError::Draw {
            file: file.clone(),
            source,
        })?;
        fs::write(&file, svg).map_err(|source| ReportError::Write {
            file: file.clone(),
            source,
        })?;
        written.push(file);
    }
    Ok(written)
}

/// A series per label, or per (label, M) when the metric was measured with
/// several endpoint counts: one line through different M would zigzag.
fn series(records: &[Record], plot: &Plot, labels: &[String]) -> Vec<Series> {
    let of_metric: Vec<(String, &Record)> = records
        .iter()
        .filter(|r| r.metric == plot.metric)
        .map(|r| (r.label(), r))
        .collect();
    let several_m = first_seen(of_metric.iter().map(|(_, r)| r.endpoints)).len() > 1;
    let drawable = |v: f64| v.is_finite() && (!plot.log_y || v > 0.0);
    let keys = first_seen(of_metric.iter().map(|(l, r)| (l.as_str(), r.endpoints)));
    let mut out = Vec::new();
    for (label, m) in keys {
        let mut points: Vec<Point> = Vec::new();
        for (_, r) in of_metric
            .iter()
            .filter(|(l, r)| l == label && r.endpoints == m)
        {
            let taken = points.iter().any(|p| p.services == r.services);
            if r.services == 0 || taken || !drawable(r.median) {
                continue;
            }
            let or_median = |v: f64| if drawable(v) { v } else { r.median };
            let (services, median) = (r.services, r.median);
            let (lo, hi) = (or_median(r.min).min(median), or_median(r.max).max(median));
            points.push(Point {
                services,
                median,
                lo,
                hi,
            });
        }
        if points.is_empty() {
            continue;
        }
        points.sort_by_key(|p| p.services);
        let (key, color) = if several_m {
            (format!("{label} M={m}"), palette(out.len() + KNOWN.len()))
        } else {
            (label.to_owned(), colour(label, labels))
        };
        out.push(Series { key, color, points });
    }
    out
}

/// Fixed colours for the dataplanes the bench knows, so that every report
/// draws e.g. iptables in red.
const KNOWN: [(&str, RGBColor); 8] = [
    ("weir-socket", RGBColor(31, 119, 180)),
    ("weir-tc", RGBColor(44, 160, 44)),
    ("weir-tc-ext", RGBColor(23, 190, 207)),
    ("weir-tc-maglev", RGBColor(140, 86, 75)),
    ("iptables-legacy", RGBColor(214, 39, 40)),
    ("iptables-nft", RGBColor(255, 127, 14)),
    ("nftables", RGBColor(148, 103, 189)),
    ("direct", RGBColor(90, 90, 90)),
];

fn colour(label: &str, labels: &[String]) -> RGBColor {
    KNOWN.iter().find(|(l, _)| *l == label).map_or_else(
        || palette(KNOWN.len() + labels.iter().position(|l| l == label).unwrap_or(0)),
        |(_, c)| *c,
    )
}

fn palette(i: usize) -> RGBColor {
    let (r, g, b) = Palette99::pick(i).rgb();
    RGBColor(r, g, b)
}

type DrawResult<T> = Result<T, DrawingAreaErrorKind<io::Error>>;

fn render(plot: &Plot, series: &[Series]) -> DrawResult<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        // The legend gets its own column: inside the chart it would cover
        // lines wherever it sat, as rates fall and latencies rise with N.
        let (chart_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let points = || series.iter().flat_map(|s| &s.points);
        let n = points().map(|p| f64::from(p.services));
        let (n_lo, n_hi) = n.fold((f64::INFINITY, 0.0_f64), |(a, b), v| (a.min(v), b.max(v)));
        let y_lo = points().map(|p| p.lo).fold(f64::INFINITY, f64::min);
        let y_hi = points().map(|p| p.hi).fold(f64::NEG_INFINITY, f64::max);
        let x = log_bounds(n_lo, n_hi, 1.5);

        let mut builder = ChartBuilder::on(&chart_area);
        builder
            .caption(plot.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(75);
        if plot.log_y {
            let y = log_bounds(y_lo, y_hi, 1.25);
            let mut chart = builder.build_cartesian_2d(x.log_scale(), y.log_scale())?;
            draw_chart(&mut chart, plot, series)?;
        } else {
            // From zero, so that the heights of the lines compare honestly.
            let (mut lo, mut hi) = (y_lo.min(0.0), y_hi.max(0.0));
            if hi <= lo {
                hi = lo + 1.0;
            }
            let pad = (hi - lo) * 0.08;
            hi += pad;
            if lo < 0.0 {
                lo -= pad;
            }
            let mut chart = builder.build_cartesian_2d(x.log_scale(), lo..hi)?;
            draw_chart(&mut chart, plot, series)?;
        }
        legend(&legend_area, series)?;
        root.present()?;
    }
    Ok(svg)
}

/// `lo/pad .. hi*pad`, widened to whole decades when no power of ten falls
/// inside: plotters labels a log axis only at powers of ten and their
/// multiples, and would leave a narrow range without any label.
fn log_bounds(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    let (lo, hi) = (lo / pad, hi * pad);
    let (a, b) = (lo.log10().floor(), hi.log10().ceil());
    if hi.log10().floor() < lo.log10().ceil() {
        10f64.powf(a)..10f64.powf(b)
    } else {
        lo..hi
    }
}

fn draw_chart<Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<LogCoord<f64>, Y>>,
    plot: &Plot,
    series: &[Series],
) -> DrawResult<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("Services (N)")
        .y_desc(plot.y_label)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .x_label_formatter(&|v| axis_number(*v))
        .y_label_formatter(&|v| axis_number(*v))
        .draw()?;
    // Bands first, so that no band veils another dataplane's line.
    for s in series.iter().filter(|s| s.points.len() > 1) {
        let n = |p: &Point| f64::from(p.services);
        let upper = s.points.iter().map(|p| (n(p), p.hi));
        let lower = s.points.iter().rev().map(|p| (n(p), p.lo));
        let band = Polygon::new(
            upper.chain(lower).collect::<Vec<_>>(),
            s.color.mix(0.15).filled(),
        );
        chart.draw_series(std::iter::once(band))?;
    }
    for s in series {
        let n = |p: &Point| f64::from(p.services);
        // Whiskers as well: a band needs two points, a lone size has none.
        chart.draw_series(s.points.iter().map(|p| {
            PathElement::new(vec![(n(p), p.lo), (n(p), p.hi)], s.color.stroke_width(1))
        }))?;
        let line: Vec<(f64, f64)> = s.points.iter().map(|p| (n(p), p.median)).collect();
        chart.draw_series(std::iter::once(PathElement::new(
            line,
            s.color.stroke_width(2),
        )))?;
        chart.draw_series(
            s.points
                .iter()
                .map(|p| Circle::new((n(p), p.median), 4, s.color.filled())),
        )?;
    }
    Ok(())
}

fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, series: &[Series]) -> DrawResult<()> {
    let text = ("sans-serif", 15)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let mut y = 60;
    for s in series {
        area.draw(&PathElement::new(
            vec![(6, y), (30, y)],
            s.color.stroke_width(2),
        ))?;
        area.draw(&Circle::new((18, y), 4, s.color.filled()))?;
        area.draw(&Text::new(s.key.as_str(), (38, y), text.clone()))?;
        y += 24;
    }
    Ok(())
}

/// Axis labels: thousands separated, no trailing zeros (a log axis ticks at
/// 0.2, 0.5, …).
fn axis_number(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        return group(v, 0);
    }
    let s = group(v, sig_decimals(v));
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests;
