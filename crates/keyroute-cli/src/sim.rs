//! `keyroute sim ...`: the simulator's commands.

use std::io::Write;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use keyroute::{Options, Strategy};
use keyroute_sim::fleet::{self, Change, FleetReport};
use keyroute_sim::{KeySet, SimError, report, scenario};

use crate::Usage;
use crate::cli::{
    BalanceArgs, ChoicesArgs, FleetArgs, FleetKnobs, KeyArgs, RemapArgs, TraceArgs, TrafficArgs, WhatifArgs,
    parse_nodes,
};

fn sim_error(e: SimError) -> anyhow::Error {
    match e {
        SimError::Placement(_) | SimError::NotByKey(_) | SimError::Invalid(_) => Usage(e.to_string()).into(),
        _ => anyhow::Error::new(e),
    }
}

fn key_set(args: &KeyArgs, traffic: Option<&std::path::Path>) -> Result<KeySet> {
    let traffic_text = traffic
        .map(|p| std::fs::read(p).with_context(|| format!("reading the traffic log {}", p.display())))
        .transpose()?;
    let keys = match (&args.keys_file, args.keys, &traffic_text) {
        (Some(path), _, _) => KeySet::from_lines(
            &std::fs::read(path).with_context(|| format!("reading the keys file {}", path.display()))?,
        ),
        (None, None, Some(t)) => return Ok(KeySet::from_traffic(t)),
        (None, n, _) => KeySet::generated(n.unwrap_or(100_000), &args.key_format),
    };
    Ok(match traffic_text {
        Some(t) => keys.with_traffic(&t),
        None => keys,
    })
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

fn print_text(text: &str) -> Result<()> {
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

pub fn remap(args: &RemapArgs) -> Result<()> {
    let parse = |flag: &str, name: &str| -> Result<Strategy, Usage> {
        name.parse().map_err(|e: keyroute::Error| Usage(format!("{flag}: {e}")))
    };
    let from = match &args.from {
        Some(f) => parse("--from", f)?,
        None => args.strategy.strategy()?,
    };
    let to = match &args.to {
        Some(t) => parse("--to", t)?,
        None => from,
    };
    let options = args.strategy.options()?;
    let before = parse_nodes("--before", &args.before)?;
    let after = match &args.after {
        Some(a) => parse_nodes("--after", a)?,
        None => before.clone(),
    };
    let keys = key_set(&args.keys, args.traffic.as_deref())?;
    let r = keyroute_sim::remap_between((from, &before), (to, &after), &options, &keys).map_err(sim_error)?;
    if args.json { print_json(&r) } else { print_text(&report::remap_text(&r)) }
}

pub fn balance(args: &BalanceArgs) -> Result<()> {
    let strategy = args.strategy.strategy()?;
    let options = args.strategy.options()?;
    let nodes = parse_nodes("--nodes", &args.nodes)?;
    let keys = key_set(&args.keys, None)?;
    let r = keyroute_sim::balance(strategy, &options, &nodes, &keys).map_err(sim_error)?;
    if args.json { print_json(&r) } else { print_text(&report::balance_text(&r)) }
}

pub fn choices(args: &ChoicesArgs) -> Result<()> {
    let r = keyroute_sim::choices(args.bins, args.balls, &args.choices, args.seed, args.runs).map_err(sim_error)?;
    if args.json { print_json(&r) } else { print_text(&report::choices_text(&r)) }
}

/// A scenario's configuration for one strategy, with the user's overrides.
pub fn configure(
    name: &str,
    strategy: Strategy,
    options: Options,
    knobs: &FleetKnobs,
) -> Result<fleet::FleetConfig, Usage> {
    let mut c = scenario::scenario(name, strategy).ok_or_else(|| {
        Usage(format!("--scenario: unknown scenario '{name}' (valid: {}, all)", scenario::SCENARIOS.join(", ")))
    })?;
    c.options = options;
    macro_rules! set {
        ($($field:ident),*) => { $(if let Some(v) = knobs.$field { c.$field = v; })* };
    }
    set!(workers, gateways, refresh_ms, concurrency, hit_ms, miss_ms, cache_entries, keys, zipf, rate, requests, seed);
    for change in &mut c.changes {
        match &mut change.change {
            Change::HotKey { share } | Change::FlashCrowd { share, .. } => *share = knobs.hot_share.unwrap_or(*share),
            Change::SlowWorker { factor, .. } => *factor = knobs.slow_factor.unwrap_or(*factor),
            _ => {}
        }
    }
    for spec in &knobs.changes {
        c.changes.push(parse_change(spec).map_err(|why| Usage(format!("--change '{spec}': {why}")))?);
    }
    c.validate().map_err(|e| Usage(e.to_string()))?;
    Ok(c)
}

/// `AT:add`, `AT:remove`, `AT:slow:WORKER:FACTOR` (WORKER from 1) or `AT:hot:SHARE`.
fn parse_change(spec: &str) -> Result<fleet::TimedChange, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let at: f64 = parts.first().and_then(|a| a.parse().ok()).ok_or("AT must be a number in [0, 1]")?;
    let num = |i: usize, what: &str| -> Result<f64, String> {
        parts.get(i).and_then(|v| v.parse::<f64>().ok()).ok_or_else(|| format!("{what} must be a number"))
    };
    let change = match (parts.get(1).copied(), parts.len()) {
        (Some("add"), 2) => Change::AddWorker,
        (Some("remove"), 2) => Change::RemoveWorker,
        (Some("slow"), 4) => {
            let worker = num(2, "WORKER")?;
            if worker < 1.0 || worker.fract() != 0.0 {
                return Err("WORKER counts from 1".into());
            }
            Change::SlowWorker { worker: worker as usize - 1, factor: num(3, "FACTOR")? }
        }
        (Some("hot"), 3) => Change::HotKey { share: num(2, "SHARE")? },
        (Some("flash"), 5) => {
            Change::FlashCrowd { share: num(2, "SHARE")?, rise_s: num(3, "RISE_S")?, hold_s: num(4, "HOLD_S")? }
        }
        _ => {
            return Err(
                "expected AT:add, AT:remove, AT:slow:WORKER:FACTOR, AT:hot:SHARE or AT:flash:SHARE:RISE_S:HOLD_S"
                    .into(),
            );
        }
    };
    Ok(fleet::TimedChange { at, change })
}

pub fn fleet(args: &FleetArgs) -> Result<()> {
    let scenarios: Vec<&str> =
        if args.scenario == "all" { scenario::SCENARIOS.to_vec() } else { vec![args.scenario.as_str()] };
    // A strategy may carry variants: `rendezvous+replicas+cache`.
    let parse = |spec: &str| -> Result<(Strategy, Vec<String>), Usage> {
        let mut parts = spec.split('+');
        let s = parts.next().unwrap_or("").parse::<Strategy>().map_err(|e| Usage(format!("--strategies: {e}")))?;
        let variants: Vec<String> = parts.map(str::to_owned).collect();
        if let Some(bad) = variants.iter().find(|v| !scenario::VARIANTS.contains(&v.as_str())) {
            return Err(Usage(format!(
                "--strategies: unknown variant '+{bad}' in '{spec}' (valid: {})",
                scenario::VARIANTS.map(|v| format!("+{v}")).join(", ")
            )));
        }
        Ok((s, variants))
    };
    let chosen: Option<Vec<(Strategy, Vec<String>)>> =
        args.strategies.as_ref().map(|list| list.iter().map(|s| parse(s)).collect::<Result<_, _>>()).transpose()?;
    if !(args.epsilon.is_finite() && args.epsilon >= 0.0) {
        return Err(Usage(format!("--epsilon: must be finite and >= 0, got {}", args.epsilon)).into());
    }
    let options = Options { epsilon: args.epsilon, vnodes: args.vnodes, ..Options::default() };
    let traffic = Traffic::load(&args.traffic)?;
    let knobs = traffic.knobs(&args.knobs)?;
    let mut configs = Vec::new();
    for name in &scenarios {
        let list = match &chosen {
            Some(list) => list.clone(),
            None => scenario::default_strategies(name).into_iter().map(parse).collect::<Result<_, _>>()?,
        };
        for (s, variants) in list {
            let mut c = configure(name, s, options, &knobs)?;
            traffic.apply(&mut c);
            for v in &variants {
                scenario::apply_variant(&mut c, v);
            }
            c.validate().map_err(|e| Usage(format!("--strategies: {}: {e}", c.label())))?;
            configs.push(c);
        }
    }
    let total: u64 = configs.iter().map(|c| c.requests).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:32} [{bar:30}] {percent}% ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(format!("{} runs", configs.len()));
    let threads = threads(args.threads)?;
    let reports = fleet::run_all(&configs, threads, &|n| bar.inc(n)).map_err(sim_error)?;
    let mut results: Vec<(String, Vec<FleetReport>)> = Vec::new();
    for r in reports {
        match results.last_mut() {
            Some((name, list)) if *name == r.config.scenario => list.push(r),
            _ => results.push((r.config.scenario.clone(), vec![r])),
        }
    }
    bar.finish_and_clear();
    if args.json {
        let mut value = serde_json::to_value(&results)?;
        strip_series(&mut value);
        return print_json(&value);
    }
    let mut out = std::io::stdout().lock();
    if let Some(t) = &traffic.trace {
        writeln!(out, "{}\n", trace_line(t))?;
    }
    for (name, reports) in &results {
        writeln!(out, "scenario: {name}")?;
        write!(out, "{}", report::fleet_table(reports))?;
        if args.verbose {
            for r in reports {
                write!(out, "{}", report::fleet_workers(r))?;
            }
        }
        writeln!(out)?;
    }
    writeln!(out, "{}", report::FLEET_LEGEND)?;
    // What each choice costs per request at this size: measured now, not simulated.
    let mut seen = Vec::new();
    for c in &configs {
        if seen.contains(&(c.strategy, c.workers)) {
            continue;
        }
        seen.push((c.strategy, c.workers));
        let ns = fleet::placement_cost_ns(c).map_err(sim_error)?;
        writeln!(
            out,
            "placement cost (measured now on this machine): {} {} per request at {} workers",
            c.strategy,
            duration_text(ns),
            c.workers
        )?;
    }
    if let Some(path) = &args.report {
        std::fs::write(path, report::html("keyroute sim fleet", &results))
            .with_context(|| format!("writing the report {}", path.display()))?;
        writeln!(out, "report written to {}", path.display())?;
    }
    Ok(())
}

/// Drops the bulky time series and CDF points from JSON output.
fn strip_series(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.remove("series");
            map.remove("latency_cdf");
            map.values_mut().for_each(strip_series);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_series),
        _ => {}
    }
}

fn duration_text(ns: f64) -> String {
    if ns >= 1000.0 { format!("{:.2} us", ns / 1000.0) } else { format!("{ns:.0} ns") }
}

fn threads(n: Option<usize>) -> Result<usize, Usage> {
    match n {
        Some(0) => Err(Usage("--threads: must be at least 1".into())),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// The user's traffic and members (`--trace`, `--workers-from`), read once for every run.
struct Traffic {
    trace: Option<std::sync::Arc<keyroute_sim::trace::Trace>>,
    members: Option<Vec<(String, u32)>>,
}

impl Traffic {
    fn load(args: &TrafficArgs) -> Result<Traffic> {
        use keyroute_sim::trace::{Trace, TraceFormat};
        let format = match args.trace_format.as_str() {
            "plain" => TraceFormat::Plain,
            "combined" => TraceFormat::Combined { template: args.key_template.clone() },
            other => return Err(Usage(format!("--trace-format: '{other}' (valid: plain, combined)")).into()),
        };
        let trace = match &args.trace {
            Some(path) => {
                Some(std::sync::Arc::new(Trace::read(path, &format).map_err(|e| Usage(format!("--trace: {e}")))?))
            }
            None => None,
        };
        let members = match &args.workers_from {
            Some(path) if path.to_str().is_some_and(|p| p.starts_with("etcd://")) => {
                let url = path.to_str().unwrap_or_default();
                let m = crate::members::etcd_members(url).with_context(|| format!("--workers-from {url}"))?;
                if m.is_empty() {
                    return Err(Usage(format!("--workers-from: {url} has no active worker")).into());
                }
                Some(m)
            }
            Some(path) => Some(members_file(path, "--workers-from")?),
            None => None,
        };
        Ok(Traffic { trace, members })
    }

    /// The knobs, checked against the trace (which sets keys, requests and rate itself), with
    /// change times in seconds (`30s:add`) turned into fractions of the trace's requests.
    fn knobs(&self, knobs: &FleetKnobs) -> Result<FleetKnobs, Usage> {
        let mut k = knobs.clone();
        if self.trace.is_some() {
            for (set, flag) in [
                (k.keys.is_some(), "--keys"),
                (k.requests.is_some(), "--requests"),
                (k.rate.is_some(), "--rate"),
                (k.zipf.is_some(), "--zipf"),
            ] {
                if set {
                    return Err(Usage(format!(
                        "{flag}: not with --trace (the trace gives its keys, requests and times)"
                    )));
                }
            }
        }
        if self.members.is_some() && k.workers.is_some() {
            return Err(Usage("--workers: not with --workers-from (the file gives the workers)".into()));
        }
        k.changes = knobs.changes.iter().map(|c| self.at_fraction(c)).collect::<Result<_, _>>()?;
        Ok(k)
    }

    /// `30s:...` as `0.25:...` (the share of the trace's requests before 30 s).
    fn at_fraction(&self, spec: &str) -> Result<String, Usage> {
        let (at, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let Some(secs) = at.strip_suffix('s') else { return Ok(spec.to_owned()) };
        let secs: f64 =
            secs.parse().map_err(|_| Usage(format!("--change '{spec}': '{at}' is not a number of seconds")))?;
        let Some(t) = &self.trace else {
            return Err(Usage(format!("--change '{spec}': a time in seconds needs --trace")));
        };
        let index = t.index_at(secs);
        if index >= t.len() {
            return Err(Usage(format!(
                "--change '{spec}': {secs} s is past the trace's last request (at {:.1} s)",
                t.duration_s()
            )));
        }
        let fraction = index as f64 / t.len() as f64;
        Ok(format!("{fraction}:{rest}"))
    }

    fn apply(&self, c: &mut fleet::FleetConfig) {
        if let Some(m) = &self.members {
            c.workers = m.len();
            c.members = Some(m.clone());
        }
        if let Some(t) = &self.trace {
            c.keys = t.catalogue.len();
            c.requests = t.len() as u64;
            c.rate = t.len() as f64 / t.duration_s().max(1e-3);
            c.trace = Some(std::sync::Arc::clone(t));
        }
    }
}

/// A members file: `NAME[:weight=W]` tokens, one per line or comma separated, `#` comments.
fn members_file(path: &std::path::Path, flag: &str) -> Result<Vec<(String, u32)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{flag}: reading {}", path.display()))?;
    let spec: Vec<&str> =
        text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).collect();
    let nodes = parse_nodes(flag, &spec.join(",")).map_err(|e| Usage(format!("{} ({})", e.0, path.display())))?;
    if nodes.is_empty() {
        return Err(Usage(format!("{flag}: {} lists no worker", path.display())).into());
    }
    Ok(nodes.nodes().iter().map(|n| (n.name().to_owned(), n.weight())).collect())
}

/// `keyroute sim whatif`: a change, over the user's traffic, before making it.
pub fn whatif(args: &WhatifArgs) -> Result<()> {
    let mut traffic_args = args.traffic.clone();
    if traffic_args.trace.is_none() {
        return Err(Usage(
            "--trace: sim whatif replays a request log (TIME KEY lines, or --trace-format combined)".into(),
        )
        .into());
    }
    if traffic_args.workers_from.is_some() {
        return Err(Usage("--workers-from: sim whatif takes its workers from --members".into()).into());
    }
    if !args.knobs.changes.is_empty() {
        return Err(Usage(
            "--change: sim whatif makes one change, given by --add, --remove, --reweight and --strategy".into(),
        )
        .into());
    }
    traffic_args.workers_from = Some(args.members.clone());
    let traffic = Traffic::load(&traffic_args)?;
    let (Some(trace), Some(before)) = (traffic.trace.clone(), traffic.members.clone()) else {
        return Err(Usage("--trace and --members are both needed".into()).into());
    };
    let parse = |flag: &str, s: &str| s.parse::<Strategy>().map_err(|e: keyroute::Error| Usage(format!("{flag}: {e}")));
    let current = parse("--current", &args.current)?;
    let next_strategy = args.strategy.as_deref().map(|s| parse("--strategy", s)).transpose()?;
    // The members after the change.
    let mut after = before.clone();
    for name in &args.remove {
        let i = after
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Usage(format!("--remove: no worker '{name}' in {}", args.members.display())))?;
        after.remove(i);
    }
    for rw in &args.reweight {
        let (name, w) = rw.rsplit_once('=').ok_or_else(|| Usage(format!("--reweight '{rw}': expected NAME=WEIGHT")))?;
        let w: u32 = w.parse().map_err(|_| Usage(format!("--reweight '{rw}': the weight is not an integer")))?;
        let entry = after
            .iter_mut()
            .find(|(n, _)| n == name)
            .ok_or_else(|| Usage(format!("--reweight: no worker '{name}'")))?;
        entry.1 = w;
    }
    for add in &args.add {
        let node = parse_nodes("--add", add)?;
        for n in node.nodes() {
            if after.iter().any(|(m, _)| m == n.name()) {
                return Err(Usage(format!("--add: '{}' is a worker already", n.name())).into());
            }
            after.push((n.name().to_owned(), n.weight()));
        }
    }
    if after == before && next_strategy.is_none_or(|s| s == current) {
        return Err(Usage("nothing changes: give --add, --remove, --reweight or --strategy".into()).into());
    }
    if after.iter().all(|(_, w)| *w == 0) {
        return Err(Usage("after the change no worker has weight".into()).into());
    }
    let to = next_strategy.unwrap_or(current);
    let options = Options::default();
    let set = |m: &[(String, u32)]| fleet::member_set(m).map_err(|e| Usage(format!("--members: {e}")));
    let keys = KeySet::with_requests(trace.catalogue.clone(), trace.counts());
    let remap = keyroute_sim::remap_between((current, &set(&before)?), (to, &set(&after)?), &options, &keys)
        .map_err(sim_error)?;
    // Two fleet runs over the trace: as things are, and with the change at --at. The first gets a
    // change that changes nothing at the same moment, so both measure the same window after it.
    let mut knobs = traffic.knobs(&args.knobs)?;
    knobs.changes.clear();
    let at_spec = traffic.at_fraction(&format!("{}:x", args.at)).map_err(|e| Usage(e.0.replace("--change", "--at")))?;
    let at: f64 =
        at_spec.split(':').next().and_then(|a| a.parse().ok()).filter(|a| (0.0..1.0).contains(a)).ok_or_else(|| {
            Usage(format!("--at '{}': a fraction in [0, 1) or seconds into the trace such as 30s", args.at))
        })?;
    let mut without = configure("steady", current, options, &knobs)?;
    traffic.apply(&mut without);
    without.changes =
        vec![fleet::TimedChange { at, change: Change::SetMembers { members: before.clone(), strategy: None } }];
    let mut with = without.clone();
    with.changes = vec![fleet::TimedChange {
        at,
        change: Change::SetMembers { members: after.clone(), strategy: next_strategy.filter(|&s| s != current) },
    }];
    for c in [&without, &with] {
        c.validate().map_err(|e| Usage(e.to_string()))?;
    }
    let runs = fleet::run_all(&[without, with], 2, &|_| {}).map_err(sim_error)?;
    if args.json {
        let mut value = serde_json::json!({ "placement": remap, "without": runs[0], "with": runs[1] });
        strip_series(&mut value);
        return print_json(&value);
    }
    let mut out = std::io::stdout().lock();
    let (a, b) = (&runs[0], &runs[1]);
    let strategies = if to == current { current.to_string() } else { format!("{current} -> {to}") };
    writeln!(out, "what if: {} ({strategies})", b.remaps.first().map_or("-", |r| r.change.as_str()))?;
    writeln!(out, "{}", trace_line(&trace))?;
    writeln!(out)?;
    write!(out, "{}", report::remap_text(&remap))?;
    writeln!(out)?;
    let change_s = b.remaps.first().map_or(0.0, |r| r.at_s);
    writeln!(out, "fleet over the trace, the change at {change_s:.1} s     without    with")?;
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let opt = |x: Option<f64>| x.map_or("-".to_owned(), pct);
    let rows: [(&str, String, String); 7] = [
        ("hit rate, whole trace", pct(a.hit_rate), pct(b.hit_rate)),
        ("hit rate, 10 s after the change", opt(a.hit_rate_10s_after_change), opt(b.hit_rate_10s_after_change)),
        ("hit rate, 60 s after the change", opt(a.hit_rate_after_change), opt(b.hit_rate_after_change)),
        (
            "peak load (busiest / mean in flight)",
            format!("{:.2}", a.max_over_mean_load),
            format!("{:.2}", b.max_over_mean_load),
        ),
        ("most requests in flight at a worker", a.max_in_flight.to_string(), b.max_in_flight.to_string()),
        ("p99 latency", format!("{:.1} ms", a.latency.p99_ms), format!("{:.1} ms", b.latency.p99_ms)),
        ("errors", a.errors.to_string(), b.errors.to_string()),
    ];
    for (name, x, y) in rows {
        writeln!(out, "  {name:<42} {x:>9} {y:>9}")?;
    }
    Ok(())
}

/// `keyroute sim trace`: a synthetic request log in the plain `TIME KEY` format, on standard output.
pub fn trace(args: &TraceArgs) -> Result<()> {
    use keyroute::hash::{RandomSource, SplitMix64};
    if !(args.rate.is_finite() && args.rate > 0.0) || args.keys == 0 || args.keys > 50_000_000 {
        return Err(Usage("--rate must be > 0 and --keys in 1..=50000000".into()).into());
    }
    let zipf = keyroute_sim::Zipf::new(args.keys, args.zipf);
    let mut rng = SplitMix64::new(args.seed);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut t = 0.0f64;
    for _ in 0..args.requests {
        writeln!(out, "{t:.6} thumb/{}.jpg", zipf.sample(&mut rng))?;
        t += -rng.unit_open().ln() / args.rate;
    }
    out.flush()?;
    Ok(())
}

fn trace_line(t: &keyroute_sim::trace::Trace) -> String {
    let skipped =
        if t.skipped > 0 { format!(" ({} lines without a request skipped)", t.skipped) } else { String::new() };
    format!("trace: {} requests, {} keys, {:.1} s{skipped}", t.len(), t.catalogue.len(), t.duration_s())
}
