//! `keyroute place`: where each key goes.

use std::io::{BufRead, BufWriter, Write};

use anyhow::Result;
use keyroute::{MovePlan, NodeSet, SlotTable, Strategy, Table, ZoneAware};

use crate::Usage;
use crate::cli::{PlaceArgs, SlotArgs, SlotPlanArgs, parse_nodes};

pub fn run(args: &PlaceArgs) -> Result<()> {
    let strategy = match &args.compat {
        Some(mode) => {
            let mode: keyroute::compat::Mode =
                mode.parse().map_err(|e: keyroute::Error| Usage(format!("--compat: {e}")))?;
            if args.zone_aware {
                return Err(
                    Usage("--zone-aware: not with --compat (the systems it reproduces have no zones)".into()).into()
                );
            }
            if mode == keyroute::compat::Mode::Guava && args.strategy.guava_input == "long" {
                return place_guava_long(args);
            }
            Strategy::Compat(mode)
        }
        None => args.strategy.strategy()?,
    };
    let options = args.strategy.options()?;
    let nodes = parse_nodes("--nodes", &args.nodes)?;
    if args.replicas == 0 {
        return Err(Usage("--replicas: must be at least 1".into()).into());
    }
    let what = if args.compat.is_some() { "--compat" } else { "--strategy" };
    let Some(table) =
        Table::build(strategy, nodes.clone(), &options).map_err(|e| Usage(format!("{what} {strategy}: {e}")))?
    else {
        return Err(Usage(format!(
            "strategy '{strategy}' does not place by key; `place` needs one that does (modulo, ring, rendezvous, jump, maglev, slots, bounded-ring, bounded-rendezvous, affinity, or a --compat mode)"
        ))
        .into());
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = Vec::with_capacity(256);
    let mut place = |key: &[u8], out: &mut dyn Write| -> std::io::Result<()> {
        let hash = keyroute::Placement::key_hash(&table, key);
        line.clear();
        if args.json {
            let list = placed(&table, &nodes, hash, args.replicas, args.zone_aware);
            let key = String::from_utf8_lossy(key);
            serde_json::to_writer(&mut line, &serde_json::json!({ "key": key, "nodes": list }))?;
        } else {
            line.extend_from_slice(key);
            for name in placed(&table, &nodes, hash, args.replicas, args.zone_aware) {
                line.push(b'\t');
                line.extend_from_slice(name.as_bytes());
            }
        }
        line.push(b'\n');
        out.write_all(&line)
    };
    for_each_key(&args.keys, &mut |key| place(key, &mut out))?;
    out.flush()?;
    Ok(())
}

/// `keyroute place --compat guava --guava-input long`: each key is the signed 64-bit input itself.
fn place_guava_long(args: &PlaceArgs) -> Result<()> {
    use keyroute::compat::guava::consistent_hash;
    let nodes = parse_nodes("--nodes", &args.nodes)?;
    if args.replicas > 1 {
        return Err(
            Usage("--replicas: a raw Guava input has no ranking; use --guava-input murmur3 or md5".into()).into()
        );
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut bad: Option<String> = None;
    for_each_key(&args.keys, &mut |key| {
        let Some(v) = std::str::from_utf8(key).ok().and_then(|k| k.trim().parse::<i64>().ok()) else {
            bad = Some(String::from_utf8_lossy(key).into_owned());
            return Err(std::io::Error::other("not a long"));
        };
        out.write_all(key)?;
        if !nodes.is_empty() {
            out.write_all(b"\t")?;
            out.write_all(nodes.nodes()[consistent_hash(v, nodes.len() as u32) as usize].name().as_bytes())?;
        }
        out.write_all(b"\n")
    })
    .map_err(|e| match &bad {
        Some(k) => anyhow::Error::from(Usage(format!("--guava-input long: key '{k}' is not a signed 64-bit integer"))),
        None => e.into(),
    })?;
    out.flush()?;
    Ok(())
}

/// Calls `f` with each key: the arguments, or without any, each line of standard input (a
/// trailing CR removed).
fn for_each_key(keys: &[String], f: &mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    if !keys.is_empty() {
        return keys.iter().try_for_each(|k| f(k.as_bytes()));
    }
    let stdin = std::io::stdin();
    let mut input = std::io::BufReader::with_capacity(1 << 16, stdin.lock());
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            return Ok(());
        }
        let key = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let key = key.strip_suffix(b"\r").unwrap_or(key);
        f(key)?;
    }
}

/// `keyroute slot`: each key's Redis Cluster slot (`KEY<TAB>SLOT`), and with `--masters`, the
/// master that `redis-cli --cluster create` with those masters gave the slot (`KEY<TAB>SLOT<TAB>MASTER`).
pub fn slot(args: &SlotArgs) -> Result<()> {
    use keyroute::compat::redis::{RedisCluster, key_slot};
    let cluster = match &args.masters {
        Some(list) => {
            let nodes = parse_nodes("--masters", list)?;
            Some(RedisCluster::new(nodes).map_err(|e| Usage(format!("--masters: {e}")))?)
        }
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    for_each_key(&args.keys, &mut |key| {
        let slot = key_slot(key);
        out.write_all(key)?;
        write!(out, "\t{slot}")?;
        if let Some(c) = &cluster
            && let Some(i) = c.slot_owner(slot)
        {
            write!(out, "\t{}", keyroute::Placement::nodes(c).nodes()[i].name())?;
        }
        out.write_all(b"\n")
    })?;
    out.flush()?;
    Ok(())
}

/// The key's first `k` nodes, by name.
fn placed<'a>(table: &Table, nodes: &'a NodeSet, hash: u64, k: usize, zone_aware: bool) -> Vec<&'a str> {
    let names = |i: usize| nodes.nodes()[i].name();
    if k == 1 {
        return keyroute::Placement::pick_hash(table, hash).map(names).into_iter().collect();
    }
    if zone_aware {
        ZoneAware::new(table.ranked_hash(hash), nodes).take(k).map(names).collect()
    } else {
        table.ranked_hash(hash).take(k).map(names).collect()
    }
}

/// `keyroute slot-plan`: the difference of the two sets' slot tables (each a function of its set
/// alone), one move per line, and a summary on standard error.
pub fn slot_plan(args: &SlotPlanArgs) -> Result<()> {
    let before = SlotTable::new(parse_nodes("--before", &args.before)?);
    let after = SlotTable::new(parse_nodes("--after", &args.after)?);
    let plan = MovePlan::between(&before, &after);
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    for m in &plan.moves {
        let from = m.from.as_deref();
        if args.json {
            serde_json::to_writer(&mut out, &serde_json::json!({ "slot": m.slot, "from": from, "to": m.to }))?;
            out.write_all(b"\n")?;
        } else {
            writeln!(out, "{}\t{}\t{}", m.slot, from.unwrap_or("-"), m.to)?;
        }
    }
    out.flush()?;
    eprintln!(
        "{} of {} slots move ({:.2}%)",
        plan.len(),
        keyroute::slots::SLOT_COUNT,
        100.0 * plan.len() as f64 / keyroute::slots::SLOT_COUNT as f64
    );
    Ok(())
}
