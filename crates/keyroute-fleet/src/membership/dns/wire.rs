//! DNS messages (RFC 1035), as much as a membership source needs: a query for one name and type,
//! and the records of an answer (A, AAAA, SRV of RFC 2782, CNAME), with their TTLs. Sans-IO:
//! bytes in, records out; the exchange is [`super::resolve`]'s.
//!
//! A response is checked before it is read: its id and question must be the query's, it must
//! be a response, and every name, pointer and length must lie inside the message (compression
//! pointers may only point backwards, so a loop cannot be written).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Record types.
pub const A: u16 = 1;
/// A canonical name.
pub const CNAME: u16 = 5;
/// An IPv6 address.
pub const AAAA: u16 = 28;
/// A service location.
pub const SRV: u16 = 33;
const CLASS_IN: u16 = 1;

/// The longest name (RFC 1035 §2.3.4).
const MAX_NAME: usize = 255;

/// A record's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// An address (A or AAAA).
    Address(IpAddr),
    /// A service location.
    Srv {
        /// Lower is preferred.
        priority: u16,
        /// Relative weight among the same priority.
        weight: u16,
        /// The port.
        port: u16,
        /// The host, without its final dot.
        target: String,
    },
    /// An alias.
    Cname(String),
}

/// One record of a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its owner name, lowercase, without the final dot.
    pub name: String,
    /// How long it may be kept, in seconds.
    pub ttl: u32,
    /// What it says.
    pub data: Data,
}

/// What a response says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The response code (0 no error, 2 server failure, 3 no such name...).
    pub rcode: u8,
    /// The message was cut to fit a datagram: ask again over TCP.
    pub truncated: bool,
    /// The answer and additional sections' records of known types.
    pub records: Vec<Record>,
}

/// Why a response could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than what it says it holds.
    #[error("the response is cut short")]
    Short,
    /// Not an answer to this query (another id or question, or not a response).
    #[error("the response does not answer the query")]
    Mismatch,
    /// A name that is not one (too long, a bad pointer or label).
    #[error("a name in the response is malformed")]
    BadName,
    /// A name to query that cannot be written.
    #[error("'{0}' cannot be asked: not a DNS name")]
    BadQuery(String),
}

/// A query for `name` and `qtype`, with recursion desired.
///
/// # Errors
///
/// A name with an empty label, a label over 63 bytes or a name over 255 bytes.
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(18 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x01, 0x00]); // RD
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    write_name(&mut out, name)?;
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(out)
}

fn write_name(out: &mut Vec<u8>, name: &str) -> Result<(), WireError> {
    let bad = || WireError::BadQuery(name.to_owned());
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() + 2 > MAX_NAME {
        return Err(bad());
    }
    for label in trimmed.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad());
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    Ok(())
}

/// Reads a response to the query `asked` (the bytes [`query`] made).
///
/// # Errors
///
/// A message cut short, one that answers another query, or a malformed name.
pub fn parse(msg: &[u8], asked: &[u8]) -> Result<Response, WireError> {
    if msg.len() < 12 || asked.len() < 12 {
        return Err(WireError::Short);
    }
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    // The same id, a response (QR), and the same question section.
    if msg[..2] != asked[..2] || flags & 0x8000 == 0 || msg.get(12..asked.len()) != asked.get(12..) {
        return Err(WireError::Mismatch);
    }
    let count = |at: usize| u16::from_be_bytes([msg[at], msg[at + 1]]) as usize;
    let (answers, authority, additional) = (count(6), count(8), count(10));
    let mut at = asked.len();
    let mut records = Vec::new();
    for section in 0..3 {
        let n = [answers, authority, additional][section];
        for _ in 0..n {
            let (name, next) = read_name(msg, at)?;
            let fixed = msg.get(next..next + 10).ok_or(WireError::Short)?;
            let rtype = u16::from_be_bytes([fixed[0], fixed[1]]);
            let class = u16::from_be_bytes([fixed[2], fixed[3]]);
            let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
            let len = u16::from_be_bytes([fixed[8], fixed[9]]) as usize;
            let start = next + 10;
            let rdata = msg.get(start..start + len).ok_or(WireError::Short)?;
            at = start + len;
            // The authority section (SOA, NS) says nothing of members.
            if section == 1 || class != CLASS_IN {
                continue;
            }
            let data = match rtype {
                A if len == 4 => Data::Address(IpAddr::V4(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]))),
                AAAA if len == 16 => {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(rdata);
                    Data::Address(IpAddr::V6(Ipv6Addr::from(b)))
                }
                SRV if len >= 7 => {
                    let (target, _) = read_name(msg, start + 6)?;
                    Data::Srv {
                        priority: u16::from_be_bytes([rdata[0], rdata[1]]),
                        weight: u16::from_be_bytes([rdata[2], rdata[3]]),
                        port: u16::from_be_bytes([rdata[4], rdata[5]]),
                        target,
                    }
                }
                CNAME => Data::Cname(read_name(msg, start)?.0),
                _ => continue,
            };
            records.push(Record { name, ttl, data });
        }
    }
    Ok(Response { rcode: (flags & 0x000f) as u8, truncated: flags & 0x0200 != 0, records })
}

/// The name at `at`: lowercase, dot-separated, without the final dot; and where what follows it
/// starts. Pointers must point before the name that uses them.
fn read_name(msg: &[u8], mut at: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut after = None;
    let mut limit = at;
    loop {
        let len = *msg.get(at).ok_or(WireError::Short)? as usize;
        match len & 0xc0 {
            0x00 if len == 0 => {
                return Ok((name, after.unwrap_or(at + 1)));
            }
            0x00 => {
                let label = msg.get(at + 1..at + 1 + len).ok_or(WireError::Short)?;
                if !name.is_empty() {
                    name.push('.');
                }
                name.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
                if name.len() > MAX_NAME {
                    return Err(WireError::BadName);
                }
                at += 1 + len;
            }
            0xc0 => {
                let low = *msg.get(at + 1).ok_or(WireError::Short)? as usize;
                let target = ((len & 0x3f) << 8) | low;
                // Only backwards, and each jump before the last: no loop can be written.
                if target >= limit {
                    return Err(WireError::BadName);
                }
                after.get_or_insert(at + 2);
                limit = target;
                at = target;
            }
            _ => return Err(WireError::BadName),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response to `asked` with these answer records (type, ttl, rdata), names compressed as
    /// pointers to the question.
    fn answer(asked: &[u8], rcode: u8, records: &[(u16, u32, Vec<u8>)]) -> Vec<u8> {
        let mut m = asked.to_vec();
        m[2] = 0x81;
        m[3] = 0x80 | rcode;
        m[7] = records.len() as u8;
        for (t, ttl, data) in records {
            m.extend_from_slice(&[0xc0, 12]);
            m.extend_from_slice(&t.to_be_bytes());
            m.extend_from_slice(&CLASS_IN.to_be_bytes());
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
        m
    }

    #[test]
    fn a_query_is_the_name_as_labels() {
        let q = query(0x1234, "_http._tcp.Web.test.", SRV).expect("a name");
        assert_eq!(&q[..12], &[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&q[12..], b"\x05_http\x04_tcp\x03Web\x04test\x00\x00\x21\x00\x01");
        for bad in ["", ".", "a..b", &"x".repeat(64), &"a.".repeat(130)] {
            assert!(query(1, bad, A).is_err(), "{bad}");
        }
    }

    #[test]
    fn srv_and_address_records_are_read_with_their_ttls() {
        let q = query(7, "_http._tcp.web.test", SRV).expect("query");
        // SRV 10 5 8080 w1.web.test, written in full; then an A with a pointer to it.
        let mut srv = vec![0, 10, 0, 5, 0x1f, 0x90];
        srv.extend_from_slice(b"\x02W1\x03web\x04test\x00");
        let m = answer(&q, 0, &[(SRV, 30, srv), (A, 5, vec![10, 0, 0, 1]), (AAAA, 9, vec![0; 16])]);
        let r = parse(&m, &q).expect("a response");
        assert_eq!(r.rcode, 0);
        assert_eq!(r.records.len(), 3);
        assert_eq!(r.records[0].name, "_http._tcp.web.test");
        assert_eq!(r.records[0].data, Data::Srv { priority: 10, weight: 5, port: 8080, target: "w1.web.test".into() });
        assert_eq!(r.records[0].ttl, 30);
        assert_eq!(r.records[1].data, Data::Address("10.0.0.1".parse().expect("ip")));
        assert_eq!(r.records[2].data, Data::Address("::".parse().expect("ip")));
    }

    #[test]
    fn answers_to_other_queries_and_broken_messages_are_refused() {
        let q = query(7, "web.test", A).expect("query");
        let good = answer(&q, 0, &[(A, 5, vec![10, 0, 0, 1])]);
        assert!(parse(&good, &q).is_ok());
        let mut other_id = good.clone();
        other_id[1] ^= 1;
        assert_eq!(parse(&other_id, &q), Err(WireError::Mismatch));
        let mut not_response = good.clone();
        not_response[2] &= 0x7f;
        assert_eq!(parse(&not_response, &q), Err(WireError::Mismatch));
        let other_name = answer(&query(7, "wab.test", A).expect("query"), 0, &[]);
        assert_eq!(parse(&other_name, &q), Err(WireError::Mismatch));
        // Every cut of a good message is refused, never read past its end.
        for cut in 0..good.len() {
            assert!(parse(&good[..cut], &q).is_err(), "cut at {cut}");
        }
        // A pointer to itself, or forwards: refused.
        let mut looped = good.clone();
        let at = q.len();
        looped[at] = 0xc0;
        looped[at + 1] = at as u8;
        assert_eq!(parse(&looped, &q), Err(WireError::BadName));
        // No such name: the code, and nothing else.
        let nx = answer(&q, 3, &[]);
        assert_eq!(parse(&nx, &q).expect("read").rcode, 3);
    }
}
