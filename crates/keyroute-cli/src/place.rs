//! `keyroute place`: where each key goes.

use std::io::{BufRead, BufWriter, Write};

use anyhow::Result;
use keyroute::{MovePlan, NodeSet, SlotTable, Table, ZoneAware};

use crate::Usage;
use crate::cli::{PlaceArgs, SlotPlanArgs, parse_nodes};

pub fn run(args: &PlaceArgs) -> Result<()> {
    let strategy = args.strategy.strategy()?;
    let options = args.strategy.options()?;
    let nodes = parse_nodes("--nodes", &args.nodes)?;
    if args.replicas == 0 {
        return Err(Usage("--replicas: must be at least 1".into()).into());
    }
    let Some(table) = Table::build(strategy, nodes.clone(), &options).map_err(|e| Usage(format!("{e}")))? else {
        return Err(Usage(format!(
            "strategy '{strategy}' does not place by key; `place` needs one that does (modulo, ring, rendezvous, jump, maglev, slots, bounded-ring, bounded-rendezvous, affinity)"
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
    if args.keys.is_empty() {
        let stdin = std::io::stdin();
        let mut input = std::io::BufReader::with_capacity(1 << 16, stdin.lock());
        let mut buf = Vec::with_capacity(256);
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            let key = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let key = key.strip_suffix(b"\r").unwrap_or(key);
            place(key, &mut out)?;
        }
    } else {
        for key in &args.keys {
            place(key.as_bytes(), &mut out)?;
        }
    }
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
