//! `keyroute place`: where each key goes.

use std::io::{BufRead, BufWriter, Write};

use anyhow::Result;
use keyroute::{MovePlan, NodeSet, SlotTable, Table, ZoneAware};

use crate::Usage;
use crate::cli::{PlaceArgs, SlotArgs, SlotPlanArgs, parse_nodes};

pub fn run(args: &PlaceArgs) -> Result<()> {
    if let Some(mode) = &args.compat {
        return place_compat(args, mode);
    }
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
    for_each_key(&args.keys, &mut |key| place(key, &mut out))?;
    out.flush()?;
    Ok(())
}

/// `keyroute place --compat MODE`: each key's node as the deployed system places it.
fn place_compat(args: &PlaceArgs, mode: &str) -> Result<()> {
    use keyroute::compat::groupcache::GroupcacheRing;
    use keyroute::compat::guava::{GuavaConsistentHash, GuavaInput, consistent_hash};
    use keyroute::compat::redis::RedisCluster;
    use keyroute::{Placement, Ranking};
    let nodes = parse_nodes("--nodes", &args.nodes)?;
    if args.zone_aware {
        return Err(Usage("--zone-aware: not with --compat (the systems it reproduces have no zones)".into()).into());
    }
    let usage = |e: keyroute::Error| Usage(format!("--compat {mode}: {e}"));
    // The raw-long Guava input parses each key; every other mode hashes it.
    let raw_long = mode == "guava" && args.guava_input == "long";
    // groupcache's ring also ranks (for -r); the other modes only pick.
    let mut ring = None;
    let table: Option<Box<dyn Placement>> = match mode {
        "redis-cluster" => Some(Box::new(RedisCluster::new(nodes.clone()).map_err(usage)?)),
        "libketama" => Some(Box::new(keyroute::compat::libketama::Libketama::new(nodes.clone()).map_err(usage)?)),
        "groupcache" => {
            ring = Some(GroupcacheRing::new(nodes.clone(), args.groupcache_replicas).map_err(usage)?);
            None
        }
        "guava" => {
            let input = match args.guava_input.as_str() {
                "murmur3" | "long" => GuavaInput::Murmur3_128,
                "md5" => GuavaInput::Md5,
                other => {
                    return Err(Usage(format!("--guava-input: '{other}' (valid: murmur3, md5, long)")).into());
                }
            };
            Some(Box::new(GuavaConsistentHash::new(nodes.clone(), input).map_err(usage)?))
        }
        other => {
            return Err(Usage(format!(
                "--compat: unknown mode '{other}' (valid: redis-cluster, groupcache, guava, libketama)"
            ))
            .into());
        }
    };
    if args.replicas > 1 && ring.is_none() {
        return Err(Usage(format!("--replicas: {mode} places each key on one node (it has no ranking)")).into());
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut bad: Option<String> = None;
    for_each_key(&args.keys, &mut |key| {
        let names: Vec<&str> = if raw_long {
            let Some(v) = std::str::from_utf8(key).ok().and_then(|k| k.trim().parse::<i64>().ok()) else {
                bad = Some(String::from_utf8_lossy(key).into_owned());
                return Err(std::io::Error::other("not a long"));
            };
            if nodes.is_empty() {
                Vec::new()
            } else {
                vec![nodes.nodes()[consistent_hash(v, nodes.len() as u32) as usize].name()]
            }
        } else if let Some(r) = &ring {
            r.ranked(key).take(args.replicas).map(|i| nodes.nodes()[i].name()).collect()
        } else {
            table.as_ref().and_then(|t| t.pick(key)).map(keyroute::Node::name).into_iter().collect()
        };
        out.write_all(key)?;
        for n in names {
            out.write_all(b"\t")?;
            out.write_all(n.as_bytes())?;
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
