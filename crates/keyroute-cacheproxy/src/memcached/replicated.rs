//! A replicated memcached pool (`[pool.replication] copies = N`): each key kept on several
//! servers, mcrouter's AllSync route for writes and MissFailover route for reads, on keyroute's
//! placement.
//!
//! - **The copies** of a key are the first `copies` healthy servers of its ranking (the stalled
//!   ones when none is healthy): a server that is down, ejected or draining passes its place to
//!   the next of the ranking, for reads and writes alike, so that both find the same servers.
//!   Only a key's own servers move when one fails (the ranking's property), as for one copy.
//! - **Writes that set the value whatever it was** (`set`, `delete`, `touch`, `ms` in set mode
//!   without a CAS, `md` without a CAS) go to every copy in the same batch, in parallel. The
//!   client hears **the worst answer** (as mcrouter's AllSync): a copy that could not be reached
//!   or did not answer makes it `SERVER_ERROR` (the write may be on the others), an error line
//!   beats `NOT_STORED`/`NOT_FOUND`/`EXISTS`, which beat success; when all agree in kind, the
//!   first copy's answer.
//! - **Writes whose result depends on the value held** (`add`, `replace`, `append`, `prepend`,
//!   `cas`, `incr`, `decr`, `ma`, and `ms`/`md` in another mode or with a CAS) run on the first
//!   copy only, and the key is deleted on the other copies in the same batch: copies never
//!   diverge (a CAS unique or a counter is one server's), and the client hears the first copy's
//!   answer. A later read that misses on another copy is repaired from the first.
//! - **`get`**, of one key or many, reads the first copy; a miss or a failure there is asked of
//!   the next copy, in order (`keyroute_pool_replica_failovers_total`), and with `repair` (on by
//!   default) a value found on a later copy is added (`ms ... ME`, so that a write that got there
//!   first wins) to the copies that answered a miss (`keyroute_pool_replica_repairs_total`). A
//!   command pipelined after such a `get` that may write waits for the `get`'s answer, so that
//!   the next copy's answer never shows the client's later write. `gets`, `gat`, `gats` and `mg`
//!   read the first copy only: their answers are one server's.
//!
//! Left as mcrouter leaves it: a copy that was down while a key was written can hold the older
//! value when it comes back, until the key expires or is written again.

use std::sync::atomic::Ordering::Relaxed;

use keyroute_cache_proto::memcache::{self as codec, Answer};

use super::{Memcached, Pending, add_value, read_values, send_one};
use crate::driver::{Batch, Placed};
use crate::servers::Slot;

/// Whether a write sets its key whatever the key held (then every copy takes it): `set`,
/// `delete`, `touch`, `ms` in set mode without a CAS, `md` without a CAS.
pub(super) fn unconditional(request: &[u8]) -> bool {
    let line = codec::line(request).map_or(request, |(_, l)| l);
    let mut words = line.split(|&c| c == b' ').filter(|w| !w.is_empty());
    match words.next().unwrap_or_default() {
        b"set" | b"delete" | b"touch" => true,
        // `ms KEY SIZE FLAGS...`: a mode other than set (`MS`), or a CAS.
        b"ms" => {
            words.skip(2).all(|f| !(f.starts_with(b"C") || (f.starts_with(b"M") && !matches!(&f[1..], b"S" | b"s"))))
        }
        b"md" => words.skip(1).all(|f| !f.starts_with(b"C")),
        _ => false,
    }
}

/// A write of a key of a replicated pool: to every copy, or to the first with the key deleted on
/// the others (see the module).
pub(super) async fn write(
    b: &mut Batch<'_, Memcached>,
    hash: Placed,
    copies: &[usize],
    (key, request): (&[u8], &[u8]),
    quiet: bool,
    answer: Answer,
) {
    if unconditional(request) {
        let (mut parts, mut unreachable) = (Vec::with_capacity(copies.len()), 0);
        for &node in copies {
            let Some(server) = b.connect(node).await else {
                unreachable += 1;
                continue;
            };
            b.sent(node);
            let out = &mut b.servers.0[server].out;
            out.extend_from_slice(request);
            if quiet {
                out.extend_from_slice(b"mn\r\n");
            }
            parts.push((server, node));
        }
        if parts.is_empty() {
            b.pool.metrics.no_worker.fetch_add(1, Relaxed);
            b.pending.push(Pending::Ready(b"SERVER_ERROR no server available\r\n"));
            return;
        }
        let noreply = quiet && answer == Answer::Line;
        b.pending.push(Pending::AllSync { parts, unreachable, answer, quiet, noreply });
        written(b, hash, key);
        return;
    }
    let p = send_one(b, hash, copies.first().copied(), request, quiet, answer, false).await;
    let sent = match &p {
        Pending::One { node, .. } => Some(*node),
        _ => None,
    };
    b.pending.push(p);
    let Some(first) = sent else { return };
    for &node in copies.iter().filter(|&&n| n != first) {
        let Some(server) = b.connect(node).await else { continue };
        let out = &mut b.servers.0[server].out;
        out.extend_from_slice(b"md ");
        out.extend_from_slice(&codec::meta_key(key));
        out.extend_from_slice(b" q\r\nmn\r\n");
        b.pending.push(Pending::Discard { server, answer: Answer::Meta, quiet: true });
    }
    written(b, hash, key);
}

/// Once a write of the key is answered: a repair that read the key before it either drops its
/// value or lands before the write is answered, and the copies a repair may have filled meanwhile
/// are deleted (the registry of [`crate::copies`], as for hot keys' copies: see
/// [`crate::driver::delete_copies`]).
fn written(b: &mut Batch<'_, Memcached>, hash: Placed, key: &[u8]) {
    if let Some(h) = hash.0 {
        b.pending.push(Pending::Written { hash: h, key: key.to_vec(), node: usize::MAX });
    }
}

/// How bad an answer to a write is, for the worst of several: success 0; the write not done
/// (`NOT_STORED`, `NOT_FOUND`, `EXISTS`, meta `NS`/`NF`/`EX`) 1; an error line 2.
fn severity(answer: &[u8]) -> u8 {
    let word = answer.split(|&c| c == b' ' || c == b'\r').next().unwrap_or_default();
    match word {
        b"ERROR" | b"CLIENT_ERROR" | b"SERVER_ERROR" => 2,
        b"NOT_STORED" | b"NOT_FOUND" | b"EXISTS" | b"NS" | b"NF" | b"EX" => 1,
        _ => 0,
    }
}

/// The client's answer to a write sent to every copy: the worst of theirs (see the module).
pub(super) fn all_sync_answer(
    b: &mut Batch<'_, Memcached>,
    parts: &[(usize, usize)],
    unreachable: usize,
    noreply: bool,
    slots: &[Slot],
    arena: &[u8],
) {
    let mut worst: Option<(u8, &[u8])> = None;
    let mut lost: Option<String> = None;
    for (&(_, node), result) in parts.iter().zip(slots) {
        match result {
            Ok(range) => {
                b.succeeded(node);
                let a = &arena[range.clone()];
                if worst.is_none_or(|(s, _)| severity(a) > s) {
                    worst = Some((severity(a), a));
                }
            }
            Err(why) => {
                b.failed(node);
                lost.get_or_insert_with(|| format!("SERVER_ERROR {why}\r\n"));
            }
        }
    }
    if noreply {
        return;
    }
    if unreachable > 0 {
        lost.get_or_insert_with(|| "SERVER_ERROR a copy could not be reached\r\n".to_owned());
    }
    match (lost, worst) {
        (Some(line), _) => b.out.extend_from_slice(line.as_bytes()),
        (None, Some((_, a))) => b.out.extend_from_slice(a),
        (None, None) => {}
    }
}

/// A `get` of one key of a replicated pool: its first copy, the others behind it.
pub(super) async fn get(
    b: &mut Batch<'_, Memcached>,
    hash: Placed,
    copies: Vec<usize>,
    key: &[u8],
    request: &[u8],
) -> Pending {
    let p = send_one(b, hash, copies.first().copied(), request, false, Answer::Line, false).await.retrieval();
    match p {
        Pending::One { server, node, .. } => {
            let rest = copies.into_iter().filter(|&n| n != node).collect();
            Pending::Copies { server, node, key: key.to_vec(), rest }
        }
        other => other,
    }
}

/// The client's answer to a `get` of one key from its first copy: the value, or past a miss or a
/// failure, the next copies' (see [`failover`]).
pub(super) async fn get_answer(
    b: &mut Batch<'_, Memcached>,
    node: usize,
    (key, rest): (&[u8], &[usize]),
    slot: &Slot,
    arena: &[u8],
) {
    let missed = match slot {
        Ok(range) => {
            b.succeeded(node);
            let a = &arena[range.clone()];
            if a.starts_with(b"VALUE ") {
                b.out.extend_from_slice(a);
                return;
            }
            a == b"END\r\n"
        }
        Err(_) => {
            b.failed(node);
            false
        }
    };
    failover(b, key, if missed { vec![node] } else { Vec::new() }, rest).await;
    b.out.extend_from_slice(b"END\r\n");
}

/// A key that missed, or failed, on its first copy: the copies left to ask, in order, and those
/// that answered a miss.
pub(super) struct Todo<'k> {
    pub(super) key: &'k [u8],
    pub(super) rest: &'k [usize],
    pub(super) missed: Vec<usize>,
}

/// A key that missed, or failed, on its first copy, asked of the `rest` in order: the first value
/// found is appended to the client's answer as a `VALUE` block, and with `repair` added to the
/// copies that answered a miss (`missed`, and those of `rest` before it). Whether one was found.
pub(super) async fn failover(b: &mut Batch<'_, Memcached>, key: &[u8], missed: Vec<usize>, rest: &[usize]) -> bool {
    match resolve(b, vec![Todo { key, rest, missed }]).await.pop().flatten() {
        Some(block) => {
            b.out.extend_from_slice(&block);
            true
        }
        None => false,
    }
}

/// Each key of `todo` asked of its next copies, in rounds: a round asks every copy its keys at
/// once (one write, pipelined `mg`s), so that a multi-get's misses cost a round trip a copy, not
/// one a key. For each key, in `todo`'s order, its `VALUE` block when a copy had it.
///
/// A repair races the key's writes as a hot key's fill does, and is fenced the same way
/// ([`crate::copies`]): it takes the key's write epoch before the read, adds its value only if no
/// write of the key was answered since, and holds the key's fill lock until the add is answered;
/// a write, once answered, waits for that lock and deletes the key on the copies repaired meanwhile
/// (a `delete` never answered before a repair brings back what it deleted).
pub(super) async fn resolve(b: &mut Batch<'_, Memcached>, mut todo: Vec<Todo<'_>>) -> Vec<Option<Vec<u8>>> {
    let repair = b.snap.config().replication.is_some_and(|r| r.repair);
    let mut found: Vec<Option<Vec<u8>>> = vec![None; todo.len()];
    let mut open: Vec<usize> = (0..todo.len()).filter(|&i| !todo[i].rest.is_empty()).collect();
    while !open.is_empty() {
        // This round: each open key's next copy, keys grouped by copy.
        let mut by: Vec<(usize, Vec<usize>)> = Vec::new();
        for &i in &open {
            let node = todo[i].rest[0];
            match by.iter_mut().find(|(n, _)| *n == node) {
                Some((_, list)) => list.push(i),
                None => by.push((node, vec![i])),
            }
        }
        for (node, list) in by {
            b.pool.metrics.replica_failovers.fetch_add(list.len() as u64, Relaxed);
            // The repairs' epochs are taken before the values are read.
            let now = tokio::time::Instant::now();
            let mut fills = Vec::new();
            for &i in &list {
                let h = b.snap.policy().key_hash(todo[i].key);
                for &m in todo[i].missed.iter().filter(|_| repair) {
                    fills.push(Some((i, m, b.s.state.copies.begin_fill(h, b.worker(m).address, now))));
                }
            }
            let keys: Vec<&[u8]> = list.iter().map(|&i| todo[i].key).collect();
            let values = read_values(b, &keys, node).await;
            let mut values = match values {
                Ok(v) => v.into_iter().map(Some).collect::<Vec<_>>(),
                Err(()) => list.iter().map(|_| None).collect(),
            };
            for (at, &i) in list.iter().enumerate() {
                match values[at].take() {
                    Some(Some(value)) => {
                        let mut block = Vec::new();
                        value.block(todo[i].key, &mut block);
                        found[i] = Some(block);
                        let mine: Vec<_> = fills.iter_mut().filter_map(|f| f.take_if(|(j, ..)| *j == i)).collect();
                        for (_, m, fill) in mine {
                            let Some(landing) = b.s.state.copies.landing(fill).await else { continue };
                            if add_value(b, todo[i].key, &value, m).await {
                                b.pool.metrics.replica_repairs.fetch_add(1, Relaxed);
                            }
                            b.s.state.copies.landed(landing, tokio::time::Instant::now());
                        }
                        todo[i].rest = &[];
                    }
                    // A miss there: it is repaired too once a later copy has the value.
                    Some(None) => {
                        todo[i].missed.push(node);
                        todo[i].rest = &todo[i].rest[1..];
                    }
                    // No answer: the next copy.
                    None => todo[i].rest = &todo[i].rest[1..],
                }
            }
        }
        open.retain(|&i| found[i].is_none() && !todo[i].rest.is_empty());
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_that_depend_on_the_value_are_told_apart() {
        for w in [
            &b"set k 0 0 1\r\n"[..],
            b"delete k",
            b"delete k noreply",
            b"touch k 10",
            b"ms k 2 T0",
            b"ms k 2 MS q",
            b"md k q",
        ] {
            assert!(unconditional(w), "{}", String::from_utf8_lossy(w));
        }
        for w in [
            &b"add k 0 0 1"[..],
            b"replace k 0 0 1",
            b"append k 0 0 1",
            b"prepend k 0 0 1",
            b"cas k 0 0 1 5",
            b"incr k 1",
            b"decr k 1",
            b"ma k",
            b"ms k 2 ME",
            b"ms k 2 C99",
            b"md k C5",
        ] {
            assert!(!unconditional(w), "{}", String::from_utf8_lossy(w));
        }
    }

    #[test]
    fn the_worst_answer_is_the_one_told() {
        assert!(severity(b"SERVER_ERROR out of memory\r\n") > severity(b"NOT_STORED\r\n"));
        assert!(severity(b"NOT_FOUND\r\n") > severity(b"DELETED\r\n"));
        assert!(severity(b"NF\r\n") > severity(b"HD\r\n"));
        assert_eq!(severity(b""), 0);
        assert_eq!(severity(b"STORED\r\n"), 0);
    }
}
