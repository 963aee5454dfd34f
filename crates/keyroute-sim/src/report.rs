//! Reports: plain-text tables for a terminal, and a self-contained HTML page with SVG charts.
//!
//! The text layout follows tower's `tower-balance` example: the same fleet run through each policy,
//! one line per policy with its hit rate and latency quantiles, then (verbose) each worker's share.

use std::fmt::Write as _;

use crate::fleet::FleetReport;
use crate::{BalanceReport, ChoicesReport, RemapReport};

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn ms(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.0}s", x / 1000.0)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// One line per run: the comparison table of a scenario.
pub fn fleet_table(reports: &[FleetReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7} {:>8} {:>6} {:>4} {:>5} {:>8} {:>7} {:>7}",
        "strategy",
        "hit",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max util",
        "max/mean",
        "max q",
        "owner",
        "remap",
        "req/s",
        "errors",
        "hot",
        "repl",
        "gw cache",
        "hit 10s",
        "hit 60s"
    );
    for r in reports {
        let remap = r.remaps.iter().filter_map(|e| e.moved_share).map(pct).collect::<Vec<_>>().join(",");
        let _ = writeln!(
            out,
            "{:<28} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8.2} {:>8} {:>7} {:>7} {:>8.0} {:>6} {:>4} {:>5} {:>8} {:>7} {:>7}",
            r.config.label(),
            pct(r.hit_rate),
            ms(r.latency.p50_ms),
            ms(r.latency.p95_ms),
            ms(r.latency.p99_ms),
            pct(r.max_utilisation),
            r.max_over_mean_load,
            r.max_queue,
            r.owner_share.map_or("-".into(), pct),
            if remap.is_empty() { "-".into() } else { remap },
            r.throughput,
            r.errors,
            if r.config.hot_keys.is_some() { r.hot_keys_max.to_string() } else { "-".into() },
            if r.config.hot_keys.is_some() { r.replicas_max.to_string() } else { "-".into() },
            if r.config.gateway_cache_ttl_ms.is_some() {
                pct(r.gateway_cache_hits as f64 / (r.completed.max(1)) as f64)
            } else {
                "-".into()
            },
            r.hit_rate_10s_after_change.map_or("-".into(), pct),
            r.hit_rate_after_change.map_or("-".into(), pct),
        );
    }
    out
}

/// Each worker's share of requests, hit rate, utilisation and worst queue, for one run.
pub fn fleet_workers(r: &FleetReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "  {} on {}:", r.config.label(), r.config.scenario);
    let _ = writeln!(
        out,
        "  {:<6} {:>9} {:>7} {:>7} {:>9} {:>9} {:>7}",
        "worker", "requests", "share", "hit", "util", "in-flight", "max q"
    );
    for w in &r.workers {
        let _ = writeln!(
            out,
            "  {:<6} {:>9} {:>7} {:>7} {:>9} {:>9.2} {:>7}",
            w.name,
            w.requests,
            pct(w.share),
            pct(w.hit_rate),
            pct(w.utilisation),
            w.mean_in_flight,
            w.max_queue
        );
    }
    out
}

/// How to read [`fleet_table`].
pub const FLEET_LEGEND: &str = "hit: the workers' cache hit rate (of the requests they served); p50/p95/p99: latency from arrival to response; max util: the busiest \
worker's busy time over its capacity; max/mean: the busiest worker's mean requests in flight over the fleet's mean \
(bounded loads caps it at 1+e); max q: the longest queue any worker had; owner: requests served by their key's owner; \
remap: keys whose owner changed at each membership change; req/s: completed requests per simulated second; \
hot: the most keys hot at once (hot-key replication on); repl: the most replicas a hot key had; gw cache: requests \
answered by a gateway's cache for hot keys, coalesced waits included; hit 10s / hit 60s: the workers' hit rate for \
requests that arrived in the 10 s / the minute after the first membership change. A strategy name with +replicas, \
+cache, +handoff or +slow-start runs with that feature (see `keyroute_sim::scenario::apply_variant`).";

/// The remap analysis as text.
pub fn remap_text(r: &RemapReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "strategy     {}", r.strategy);
    let _ = writeln!(out, "keys         {}", r.keys);
    let _ = writeln!(out, "moved        {} ({})", r.moved, pct(r.moved_share));
    let _ = writeln!(out, "ideal        {} (the least any placement must move)", pct(r.ideal_share));
    if let Some(t) = &r.traffic {
        let _ = writeln!(
            out,
            "requests     {} in the traffic log, {} for moved keys ({})",
            t.requests,
            t.moved,
            pct(t.moved_share)
        );
    }
    if !r.matrix.is_empty() {
        let _ = writeln!(out, "moves (from -> to: keys)");
        for m in &r.matrix {
            let _ = writeln!(out, "  {} -> {}: {}", m.from, m.to, m.keys);
        }
    }
    let _ = writeln!(out, "per node before: keys, moving away{}", if r.traffic.is_some() { " (requests)" } else { "" });
    for c in &r.before {
        let req = c.moved_requests.map(|q| format!(" ({q} requests)")).unwrap_or_default();
        let _ = writeln!(out, "  {}: {}, {}{req}", c.node, c.keys, c.moved);
    }
    let _ = writeln!(out, "per node after: keys, arriving{}", if r.traffic.is_some() { " (requests)" } else { "" });
    for c in &r.after {
        let req = c.moved_requests.map(|q| format!(" ({q} requests)")).unwrap_or_default();
        let _ = writeln!(out, "  {}: {}, {}{req}", c.node, c.keys, c.moved);
    }
    out
}

/// The balance analysis as text.
pub fn balance_text(r: &BalanceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<16} {:>7} {:>10} {:>8} {:>9}", "node", "weight", "keys", "share", "expected");
    for n in &r.nodes {
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>10} {:>8} {:>9}",
            n.node,
            n.weight,
            n.keys,
            pct(n.share),
            pct(n.expected_share)
        );
    }
    let _ = writeln!(
        out,
        "{} keys; peak/mean {:.4}, min/mean {:.4}, relative stddev {:.4}",
        r.keys, r.peak_over_mean, r.min_over_mean, r.relative_stddev
    );
    out
}

/// The balls-into-bins result as text.
pub fn choices_text(r: &ChoicesReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} balls into {} bins, {} run(s), seed {}", r.balls, r.bins, r.runs, r.seed);
    let _ = writeln!(out, "{:>8} {:>14} {:>10}   bins by load (first run)", "choices", "busiest bin", "mean");
    for row in &r.results {
        let maxes = row.max_load.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let hist = row.load_histogram.iter().enumerate().map(|(l, c)| format!("{l}:{c}")).collect::<Vec<_>>().join(" ");
        let _ = writeln!(out, "{:>8} {:>14} {:>10.2}   {}", row.choices, maxes, row.mean_max_load, hist);
    }
    out
}

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A line chart drawn by `plotters` as SVG: `series` of `(label, points)`, with axis titles (their
/// units in parentheses); `log_x` for a logarithmic x axis. Points that are not finite are left
/// out; a chart with no point says so.
pub fn line_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(l, p)| {
            let p = p.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0));
            (l.clone(), p.collect())
        })
        .collect();
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() || x1 <= x0 {
        (x0, x1) = if log_x { (0.1, 1.0) } else { (0.0, 1.0) };
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let y_range = 0.0..axis_top(y1);
    let drawn = if log_x {
        svg_chart(title, x_title, y_title, &series, plotters::prelude::IntoLogRange::log_scale(x0..x1), y_range)
    } else {
        svg_chart(title, x_title, y_title, &series, x0..x1, y_range)
    };
    drawn.unwrap_or_else(|e| format!("<p>{}: the chart could not be drawn ({})</p>", esc(title), esc(&e)))
}

/// The top of a y axis whose highest point is `y1 > 0`: a multiple of a round step (1, 2, 2.5 or 5
/// times a power of ten, about a quarter of `y1`) at least 10% above `y1`, so that a line at the
/// highest value (every worker at 10/s) is drawn below the frame, not on it.
fn axis_top(y1: f64) -> f64 {
    let rough = y1 / 4.0;
    let p = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * p).find(|&s| s >= rough).unwrap_or(10.0 * p);
    (y1 * 1.1 / step).ceil() * step
}

/// The chart size, in pixels.
const CHART: (u32, u32) = (760, 320);

fn svg_chart<X>(
    title: &str,
    x_title: &str,
    y_title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    x: X,
    y: std::ops::Range<f64>,
) -> Result<String, String>
where
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Debug| format!("{e:?}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, CHART).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(58)
            .build_cartesian_2d(x, y)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_title)
            .y_desc(y_title)
            .light_line_style(RGBColor(238, 238, 238))
            .y_label_formatter(&|v| short(*v))
            .draw()
            .map_err(|e| err(&e))?;
        if series.iter().all(|(_, p)| p.is_empty()) {
            root.draw(&Text::new("no data", (CHART.0 as i32 / 2 - 20, CHART.1 as i32 / 2), ("sans-serif", 13)))
                .map_err(|e| err(&e))?;
        }
        for (i, (label, points)) in series.iter().enumerate() {
            let color = color(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(3)));
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(200, 200, 200))
                .label_font(("sans-serif", 11))
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// A bar chart drawn by `plotters` as SVG: one bar per `(label, value)`, values as percentages
/// of 1 when `percent`.
pub fn bar_chart(title: &str, y_title: &str, bars: &[(String, f64)], percent: bool) -> String {
    use plotters::prelude::*;
    let draw = || -> Result<String, String> {
        let err = |e: &dyn std::fmt::Debug| format!("{e:?}");
        let scale = if percent { 100.0 } else { 1.0 };
        let top = bars.iter().map(|(_, v)| v * scale).filter(|v| v.is_finite()).fold(0.0f64, f64::max).max(1e-9) * 1.15;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (CHART.0, 260)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| err(&e))?;
            let n = bars.len().max(1) as u32;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 15))
                .margin(10)
                .x_label_area_size(38)
                .y_label_area_size(58)
                .build_cartesian_2d((0u32..n).into_segmented(), 0.0..top)
                .map_err(|e| err(&e))?;
            let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .y_desc(y_title)
                .x_labels(bars.len().max(1))
                .x_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
                    _ => String::new(),
                })
                .y_label_formatter(&|v| short(*v))
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| err(&e))?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                    let i = i as u32;
                    let mut r = Rectangle::new(
                        [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), (v * scale).max(0.0))],
                        color(i as usize).filled(),
                    );
                    r.set_margin(0, 0, 12, 12);
                    r
                }))
                .map_err(|e| err(&e))?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                    let label = if percent { format!("{:.1}%", v * 100.0) } else { short(*v) };
                    Text::new(label, (SegmentValue::CenterOf(i as u32), v * scale), ("sans-serif", 11))
                }))
                .map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Ok(svg)
    };
    draw().unwrap_or_else(|e| format!("<p>{}: the chart could not be drawn ({})</p>", esc(title), esc(&e)))
}

/// Series colours: distinct, readable on white.
fn color(i: usize) -> plotters::style::RGBColor {
    const C: [(u8, u8, u8); 12] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
        (0, 0, 128),
        (128, 128, 0),
    ];
    let (r, g, b) = C[i % C.len()];
    plotters::style::RGBColor(r, g, b)
}

fn short(v: f64) -> String {
    if v.abs() >= 10.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// A chart's data: its title, axis titles and `(label, points)` series.
pub type Chart = (String, &'static str, &'static str, Vec<(String, Vec<(f64, f64)>)>);

/// One part of an HTML report: a heading, a preformatted table, then its charts: a latency CDF
/// of every run, the worker cache hit rate over time of every run, the keys each run moved, and
/// one load-over-time chart per run; and pictures. A part without data draws no chart.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// The heading.
    pub title: String,
    /// A text table, shown preformatted.
    pub table: Option<String>,
    /// `(label, (ms, fraction) points)` per run.
    pub cdfs: Vec<(String, Vec<(f64, f64)>)>,
    /// `(label, (seconds, hit rate) points)` per run.
    pub hits: Vec<(String, Vec<(f64, f64)>)>,
    /// `(label, share of the keys moved)` per run that changed its members.
    pub moved: Vec<(String, f64)>,
    /// Per-run charts of load over time.
    pub load: Vec<Chart>,
    /// `(caption, data: URI)` pictures.
    pub figures: Vec<(String, String)>,
}

/// A self-contained HTML page: paragraphs of introduction, an optional summary table, then the
/// sections, each with its table and SVG charts.
pub fn page(title: &str, intro: &[String], summary: Option<&str>, sections: &[Section]) -> String {
    let mut out = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>body{{font-family:sans-serif;max-width:1560px;margin:2em auto;padding:0 1em}}\
         pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}.grid{{display:flex;flex-wrap:wrap;gap:8px}}\
         figure{{margin:0 12px 12px 0}}figcaption{{font-size:12px;color:#555}}</style></head><body><h1>{t}</h1>",
        t = esc(title)
    );
    for p in intro {
        let _ = write!(out, "<p>{}</p>", esc(p));
    }
    if let Some(t) = summary {
        let _ = write!(out, "<pre>{}</pre>", esc(t));
    }
    for s in sections {
        let _ = write!(out, "<h2>{}</h2>", esc(&s.title));
        if let Some(t) = &s.table {
            let _ = write!(out, "<pre>{}</pre>", esc(t));
        }
        out.push_str("<div class=\"grid\">");
        if !s.cdfs.is_empty() {
            out.push_str(&line_chart(
                &format!("{}: latency CDF", s.title),
                "latency (ms, log scale)",
                "fraction of requests",
                &s.cdfs,
                true,
            ));
        }
        if s.hits.iter().any(|(_, p)| !p.is_empty()) {
            out.push_str(&line_chart(
                &format!("{}: worker cache hit rate", s.title),
                "time (s)",
                "hit rate (fraction of requests)",
                &s.hits,
                false,
            ));
        }
        if !s.moved.is_empty() {
            out.push_str(&bar_chart(
                &format!("{}: keys moved by the change", s.title),
                "keys moved (%)",
                &s.moved,
                true,
            ));
        }
        for (title, x, y, series) in &s.load {
            out.push_str(&line_chart(title, x, y, series, false));
        }
        for (caption, uri) in &s.figures {
            let _ = write!(
                out,
                "<figure><img src=\"{}\" alt=\"{c}\"><figcaption>{c}</figcaption></figure>",
                esc(uri),
                c = esc(caption)
            );
        }
        out.push_str("</div>");
    }
    out.push_str("</body></html>\n");
    out
}

/// Standard base64 (RFC 4648), for pictures embedded in a page.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16 | u32::from(*c.get(1).unwrap_or(&0)) << 8 | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The fleet simulator's report: for each scenario, its table, the latency CDF of every strategy,
/// and each strategy's requests in flight per worker over time.
pub fn html(title: &str, scenarios: &[(String, Vec<FleetReport>)]) -> String {
    let sections: Vec<Section> = scenarios
        .iter()
        .map(|(name, reports)| Section {
            title: name.clone(),
            table: Some(fleet_table(reports)),
            cdfs: reports.iter().map(|r| (r.config.label(), r.latency_cdf.clone())).collect(),
            hits: reports
                .iter()
                .map(|r| {
                    let points = r.series.times_s.iter().zip(&r.series.hit_rate);
                    (r.config.label(), points.filter_map(|(&t, h)| h.map(|h| (t, h))).collect())
                })
                .collect(),
            moved: reports.iter().filter_map(|r| Some((r.config.label(), r.remaps.first()?.moved_share?))).collect(),
            figures: Vec::new(),
            load: reports
                .iter()
                .map(|r| {
                    let series = r
                        .workers
                        .iter()
                        .zip(&r.series.in_flight)
                        .map(|(w, s)| {
                            (w.name.clone(), r.series.times_s.iter().zip(s).map(|(&t, &v)| (t, f64::from(v))).collect())
                        })
                        .collect();
                    (
                        format!("{name} / {}: requests in flight per worker", r.config.label()),
                        "simulated time (s)",
                        "in flight",
                        series,
                    )
                })
                .collect(),
        })
        .collect();
    page(title, &[FLEET_LEGEND.to_owned()], None, &sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_escape_and_close() {
        let svg = line_chart("a <b>", "x", "y", &[("s&t".into(), vec![(1.0, 2.0), (3.0, 4.0)])], true);
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("s&amp;t"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        let empty = line_chart("e", "x", "y", &[], false);
        assert!(empty.trim_end().ends_with("</svg>") && empty.contains("no data"));
        // Points that cannot be drawn are left out, not drawn at infinity.
        let odd =
            line_chart("n", "x", "y", &[("s".into(), vec![(f64::NAN, 1.0), (0.0, 1.0), (1.0, f64::INFINITY)])], true);
        assert!(odd.trim_end().ends_with("</svg>"));
        let bars = bar_chart("moved", "keys moved (%)", &[("ring".into(), 0.11), ("mod<n>".into(), 0.89)], true);
        assert!(bars.contains("89.0%") && bars.contains("mod&lt;n&gt;"), "{bars}");
    }

    #[test]
    fn a_flat_line_has_room_above_it() {
        assert_eq!(axis_top(10.0), 12.5);
        assert_eq!(axis_top(1.0), 1.25);
        assert_eq!(axis_top(100.0), 125.0);
        for i in 1..2000 {
            let y = f64::from(i) * 0.37;
            let top = axis_top(y);
            assert!(top >= y * 1.1 && top <= y * 1.8, "{y} -> {top}");
        }
    }

    #[test]
    fn base64_is_rfc_4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"M"), "TQ==");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"\xff\xfe\xfd\xfc"), "//79/A==");
    }
}
