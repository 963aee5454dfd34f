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

const COLORS: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
    "#1f77b4", "#8c564b",
];

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A line chart: `series` of `(label, points)`, with axis titles; `log_x` for a logarithmic x axis.
pub fn line_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 300.0, 60.0, 150.0, 30.0, 40.0);
    let fx = |x: f64| if log_x { x.max(1e-3).log10() } else { x };
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y1 = y1.max(y);
    }
    if !x0.is_finite() || x1 <= x0 {
        x0 = 0.0;
        x1 = 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let sx = |x: f64| left + (fx(x) - x0) / (x1 - x0) * (w - left - right);
    let sy = |y: f64| top + (1.0 - y / y1) * (h - top - bottom);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\
         <text x=\"{left}\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{}</text>\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>",
        esc(title),
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=4 {
        let fy = y1 * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left - 4.0,
            sy(fy) + 4.0,
            short(fy)
        );
        let fxv = x0 + (x1 - x0) * f64::from(i) / 4.0;
        let label = if log_x { 10f64.powf(fxv) } else { fxv };
        let px = left + (fxv - x0) / (x1 - x0) * (w - left - right);
        let _ = write!(
            svg,
            "<text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            h - bottom + 14.0,
            short(label)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (left + w - right) / 2.0,
        h - 6.0,
        esc(x_title)
    );
    let _ = write!(
        svg,
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
        h / 2.0,
        h / 2.0,
        esc(y_title)
    );
    for (i, (label, p)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = p.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        let ly = top + 14.0 * i as f64;
        let _ = write!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            w - right + 10.0,
            ly,
            w - right + 24.0,
            ly + 9.0,
            esc(label)
        );
    }
    svg.push_str("</svg>");
    svg
}

fn short(v: f64) -> String {
    if v.abs() >= 10.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// A chart's data: its title, axis titles and `(label, points)` series.
pub type Chart = (String, &'static str, &'static str, Vec<(String, Vec<(f64, f64)>)>);

/// One part of an HTML report: a heading, a preformatted table, a latency CDF of every run, and
/// one load-over-time chart per run.
#[derive(Clone, Debug, Default)]
pub struct Section {
    /// The heading.
    pub title: String,
    /// A text table, shown preformatted.
    pub table: Option<String>,
    /// `(label, (ms, fraction) points)` per run.
    pub cdfs: Vec<(String, Vec<(f64, f64)>)>,
    /// Per-run charts of load over time.
    pub load: Vec<Chart>,
}

/// A self-contained HTML page: paragraphs of introduction, an optional summary table, then the
/// sections, each with its table and SVG charts.
pub fn page(title: &str, intro: &[String], summary: Option<&str>, sections: &[Section]) -> String {
    let mut out = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}\
         pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}.grid{{display:flex;flex-wrap:wrap}}</style></head><body><h1>{t}</h1>",
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
        out.push_str(&line_chart(
            &format!("{}: latency CDF", s.title),
            "latency (ms, log scale)",
            "fraction of requests",
            &s.cdfs,
            true,
        ));
        out.push_str("<div class=\"grid\">");
        for (title, x, y, series) in &s.load {
            out.push_str(&line_chart(title, x, y, series, false));
        }
        out.push_str("</div>");
    }
    out.push_str("</body></html>\n");
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
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("s&amp;t") && svg.ends_with("</svg>"));
        let empty = line_chart("e", "x", "y", &[], false);
        assert!(empty.ends_with("</svg>"));
    }
}
