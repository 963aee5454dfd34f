//! `keyroute sim ...`: the simulator's commands.

use std::io::Write;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use keyroute::{Options, Strategy};
use keyroute_sim::fleet::{self, Change, FleetReport};
use keyroute_sim::{KeySet, SimError, report, scenario};

use crate::Usage;
use crate::cli::{BalanceArgs, ChoicesArgs, FleetArgs, FleetKnobs, KeyArgs, RemapArgs, parse_nodes};

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
    let mut configs = Vec::new();
    for name in &scenarios {
        let list = match &chosen {
            Some(list) => list.clone(),
            None => scenario::default_strategies(name).into_iter().map(parse).collect::<Result<_, _>>()?,
        };
        for (s, variants) in list {
            let mut c = configure(name, s, options, &args.knobs)?;
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
    let mut results: Vec<(String, Vec<FleetReport>)> = Vec::new();
    let mut done = 0u64;
    for c in &configs {
        bar.set_message(format!("{} / {}", c.scenario, c.strategy));
        let r = fleet::run(c, &mut |n| bar.set_position(done + n)).map_err(sim_error)?;
        done += c.requests;
        bar.set_position(done);
        match results.last_mut() {
            Some((name, list)) if *name == c.scenario => list.push(r),
            _ => results.push((c.scenario.clone(), vec![r])),
        }
    }
    bar.finish_and_clear();
    if args.json {
        let mut value = serde_json::to_value(&results)?;
        strip_series(&mut value);
        return print_json(&value);
    }
    let mut out = std::io::stdout().lock();
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
