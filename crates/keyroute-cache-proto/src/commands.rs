//! The Redis commands a proxy places, in one table: each command of one key (its first
//! argument) with whether it only reads that key, and the reasons the others are refused.
//!
//! A command of one key is sent to the key's server as the client wrote it. Whether it only reads
//! its key decides what a hot key's copies need: a read may be served by a replica's copy, any
//! other command deletes the copies (see the cache proxy's hot keys). Commands of several keys
//! that a proxy can split (`MGET`, `MSET`, `DEL`...) or must keep on one server (`MSETNX`,
//! `EVAL`) are the proxy's own, by name; everything else is refused with [`refusal`]'s reason,
//! or as unknown.

/// What a command of one key does to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// It only reads the key.
    Read,
    /// It may write the key (or its expiry, or delete it).
    Write,
}

use Access::{Read, Write};

/// The commands of one key, the key first, sorted by name (for a binary search; a test keeps it
/// so).
const ONE_KEY: &[(&str, Access)] = &[
    ("APPEND", Write),
    ("BITCOUNT", Read),
    ("BITFIELD", Write),
    ("BITFIELD_RO", Read),
    ("BITPOS", Read),
    ("DECR", Write),
    ("DECRBY", Write),
    ("DUMP", Read),
    ("EXPIRE", Write),
    ("EXPIREAT", Write),
    ("EXPIRETIME", Read),
    ("GEOADD", Write),
    ("GEODIST", Read),
    ("GEOHASH", Read),
    ("GEOPOS", Read),
    ("GEORADIUSBYMEMBER_RO", Read),
    ("GEORADIUS_RO", Read),
    ("GEOSEARCH", Read),
    ("GET", Read),
    ("GETBIT", Read),
    ("GETDEL", Write),
    ("GETEX", Write),
    ("GETRANGE", Read),
    ("GETSET", Write),
    ("HDEL", Write),
    ("HEXISTS", Read),
    ("HEXPIRE", Write),
    ("HEXPIREAT", Write),
    ("HEXPIRETIME", Read),
    ("HGET", Read),
    ("HGETALL", Read),
    ("HGETDEL", Write),
    ("HGETEX", Write),
    ("HINCRBY", Write),
    ("HINCRBYFLOAT", Write),
    ("HKEYS", Read),
    ("HLEN", Read),
    ("HMGET", Read),
    ("HMSET", Write),
    ("HPERSIST", Write),
    ("HPEXPIRE", Write),
    ("HPEXPIREAT", Write),
    ("HPEXPIRETIME", Read),
    ("HPTTL", Read),
    ("HRANDFIELD", Read),
    ("HSCAN", Read),
    ("HSET", Write),
    ("HSETEX", Write),
    ("HSETNX", Write),
    ("HSTRLEN", Read),
    ("HTTL", Read),
    ("HVALS", Read),
    ("INCR", Write),
    ("INCRBY", Write),
    ("INCRBYFLOAT", Write),
    ("LINDEX", Read),
    ("LINSERT", Write),
    ("LLEN", Read),
    ("LPOP", Write),
    ("LPOS", Read),
    ("LPUSH", Write),
    ("LPUSHX", Write),
    ("LRANGE", Read),
    ("LREM", Write),
    ("LSET", Write),
    ("LTRIM", Write),
    ("PERSIST", Write),
    ("PEXPIRE", Write),
    ("PEXPIREAT", Write),
    ("PEXPIRETIME", Read),
    ("PFADD", Write),
    ("PSETEX", Write),
    ("PTTL", Read),
    ("RESTORE", Write),
    ("RPOP", Write),
    ("RPUSH", Write),
    ("RPUSHX", Write),
    ("SADD", Write),
    ("SCARD", Read),
    ("SET", Write),
    ("SETBIT", Write),
    ("SETEX", Write),
    ("SETNX", Write),
    ("SETRANGE", Write),
    ("SISMEMBER", Read),
    ("SMEMBERS", Read),
    ("SMISMEMBER", Read),
    ("SORT_RO", Read),
    ("SPOP", Write),
    ("SRANDMEMBER", Read),
    ("SREM", Write),
    ("SSCAN", Read),
    ("STRLEN", Read),
    ("SUBSTR", Read),
    ("TTL", Read),
    ("TYPE", Read),
    ("XACK", Write),
    ("XADD", Write),
    ("XAUTOCLAIM", Write),
    ("XCLAIM", Write),
    ("XDEL", Write),
    ("XLEN", Read),
    ("XPENDING", Read),
    ("XRANGE", Read),
    ("XREVRANGE", Read),
    ("XSETID", Write),
    ("XTRIM", Write),
    ("ZADD", Write),
    ("ZCARD", Read),
    ("ZCOUNT", Read),
    ("ZINCRBY", Write),
    ("ZLEXCOUNT", Read),
    ("ZMSCORE", Read),
    ("ZPOPMAX", Write),
    ("ZPOPMIN", Write),
    ("ZRANDMEMBER", Read),
    ("ZRANGE", Read),
    ("ZRANGEBYLEX", Read),
    ("ZRANGEBYSCORE", Read),
    ("ZRANK", Read),
    ("ZREM", Write),
    ("ZREMRANGEBYLEX", Write),
    ("ZREMRANGEBYRANK", Write),
    ("ZREMRANGEBYSCORE", Write),
    ("ZREVRANGE", Read),
    ("ZREVRANGEBYLEX", Read),
    ("ZREVRANGEBYSCORE", Read),
    ("ZREVRANK", Read),
    ("ZSCAN", Read),
    ("ZSCORE", Read),
];

/// A command of one key (`name` in upper case, `args` its argument count with the name): what it
/// does to the key, or `None` when it is not a command of one key. `PFCOUNT` is one only with one
/// key (with several it merges them, on one server).
pub fn one_key(name: &str, args: usize) -> Option<Access> {
    if name == "PFCOUNT" {
        return (args == 2).then_some(Read);
    }
    lookup(name).and_then(|(access, _)| access)
}

/// The commands a Redis listener counts apart besides those of one key: those it splits, keeps
/// on one server or answers itself, then every other command.
const COUNTED: [&str; 17] = [
    "MGET", "MSET", "DEL", "UNLINK", "EXISTS", "TOUCH", "MSETNX", "EVAL", "EVALSHA", "PING", "ECHO", "SELECT",
    "COMMAND", "CLIENT", "AUTH", "HELLO", "QUIT",
];

/// The classes a Redis listener's commands are counted by, in metrics and the slow log: each
/// command of one key, those of [`COUNTED`], and `OTHER` (refused and unknown commands
/// included), so that a client's names never become labels.
pub fn classes() -> &'static [&'static str] {
    static CLASSES: std::sync::LazyLock<Vec<&'static str>> =
        std::sync::LazyLock::new(|| ONE_KEY.iter().map(|(n, _)| *n).chain(COUNTED).chain(["OTHER"]).collect());
    &CLASSES
}

/// The class of every command not in the table: `OTHER`'s index in [`classes`].
pub const OTHER: u16 = (ONE_KEY.len() + COUNTED.len()) as u16;

/// The class of command `name` (in upper case): its index in [`classes`].
pub fn class(name: &str) -> u16 {
    lookup(name).map_or(OTHER, |(_, class)| class)
}

/// A name's entry in the one table of counted commands: what it does to its key when it is a
/// command of one key, and its class.
fn lookup(name: &str) -> Option<(Option<Access>, u16)> {
    // A command name is looked up for every command a Redis listener serves: an open-addressing
    // table (FNV-1a of the name, 512 slots for about 160 names), so that a lookup is a short hash
    // and mostly one comparison.
    type Entry = Option<(&'static str, Option<Access>, u16)>;
    static TABLE: std::sync::LazyLock<Vec<Entry>> = std::sync::LazyLock::new(|| {
        let mut t = vec![None; SLOTS];
        let named = ONE_KEY.iter().map(|&(n, a)| (n, Some(a))).chain(COUNTED.iter().map(|&n| (n, None)));
        for (class, (n, a)) in named.enumerate() {
            let mut i = slot(n);
            while t[i].is_some() {
                i = (i + 1) % SLOTS;
            }
            t[i] = Some((n, a, class as u16));
        }
        t
    });
    let mut i = slot(name);
    loop {
        match TABLE[i] {
            Some((n, a, class)) if n == name => return Some((a, class)),
            Some(_) => i = (i + 1) % SLOTS,
            None => return None,
        }
    }
}

/// The command table's size: a power of two, well above the names it holds (so probes are short
/// and an empty slot always ends a search).
const SLOTS: usize = 512;

/// A name's first slot: FNV-1a (the table's own index; not a placement hash).
fn slot(name: &str) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h as usize % SLOTS
}

/// Why a command (`name` in upper case) is not proxied, when it is one of the known kinds that
/// cannot be: `None` for a command this table does not know.
pub fn refusal(name: &str) -> Option<&'static str> {
    Some(match name {
        "KEYS" | "SCAN" | "RANDOMKEY" | "DBSIZE" | "FLUSHALL" | "FLUSHDB" | "INFO" | "CONFIG" | "SAVE" | "BGSAVE"
        | "BGREWRITEAOF" | "LASTSAVE" | "SHUTDOWN" | "SLAVEOF" | "REPLICAOF" | "DEBUG" | "MONITOR" | "SWAPDB"
        | "MOVE" | "MIGRATE" | "CLUSTER" | "SCRIPT" | "FUNCTION" | "FCALL" | "FCALL_RO" | "SLOWLOG" | "LATENCY"
        | "MEMORY" | "MODULE" | "ACL" | "ROLE" | "TIME" | "LOLWUT" | "RESET" | "FAILOVER" | "SYNC" | "PSYNC" => {
            "concerns every server or none, not a key"
        }
        "BLPOP" | "BRPOP" | "BRPOPLPUSH" | "BLMOVE" | "BLMPOP" | "BZPOPMIN" | "BZPOPMAX" | "BZMPOP" | "WAIT"
        | "WAITAOF" | "XREAD" | "XREADGROUP" => "blocks, holding a server connection",
        "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "UNWATCH" => "is a transaction, whose keys may be on several servers",
        "SUBSCRIBE" | "PSUBSCRIBE" | "SSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SUNSUBSCRIBE" | "PUBLISH"
        | "SPUBLISH" | "PUBSUB" => "is pub/sub, which has no key to place",
        "AUTH" => "authenticates, and this listener has no password (set password on the listener)",
        "RENAME" | "RENAMENX" | "SMOVE" | "LMOVE" | "RPOPLPUSH" | "SDIFFSTORE" | "SINTERSTORE" | "SUNIONSTORE"
        | "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" | "ZRANGESTORE" | "GEOSEARCHSTORE" | "BITOP" | "COPY"
        | "SORT" | "PFMERGE" | "SDIFF" | "SINTER" | "SUNION" | "ZDIFF" | "ZINTER" | "ZUNION" | "PFCOUNT"
        | "SINTERCARD" | "ZINTERCARD" | "LMPOP" | "ZMPOP" | "OBJECT" | "XINFO" | "XGROUP" | "LCS" => {
            "takes several keys or a subcommand keyroute does not place"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_refuses_none_of_its_own() {
        assert!(ONE_KEY.windows(2).all(|w| w[0].0 < w[1].0), "ONE_KEY must stay sorted for its binary search");
        for (name, _) in ONE_KEY {
            assert!(one_key(name, 2).is_some(), "{name}");
            assert_eq!(refusal(name), None, "{name} is placed and refused");
            assert!(name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'), "{name}");
        }
    }

    #[test]
    fn reads_and_writes() {
        for (name, want) in [("GET", Read), ("SET", Write), ("HGETALL", Read), ("GETDEL", Write), ("GETEX", Write)] {
            assert_eq!(one_key(name, 2), Some(want), "{name}");
        }
        assert_eq!(one_key("PFCOUNT", 2), Some(Read));
        assert_eq!(one_key("PFCOUNT", 3), None, "PFCOUNT of several keys merges them");
        assert_eq!(one_key("MGET", 2), None);
        assert_eq!(classes()[usize::from(class("GET"))], "GET");
        assert_eq!(classes()[usize::from(class("MGET"))], "MGET");
        assert_eq!(classes()[usize::from(class("NOSUCH"))], "OTHER");
        assert_eq!(classes()[usize::from(class("FLUSHALL"))], "OTHER");
        assert_eq!(usize::from(OTHER), classes().len() - 1);
        // One class a name: none counted apart is also a command of one key.
        assert!(COUNTED.iter().all(|c| ONE_KEY.iter().all(|(n, _)| n != c)));
        for (i, name) in classes().iter().enumerate().take(classes().len() - 1) {
            assert_eq!(usize::from(class(name)), i, "{name}");
        }
        assert_eq!(one_key("get", 2), None, "names are matched in upper case");
    }
}
