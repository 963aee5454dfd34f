//! Request logs to replay: the user's own traffic instead of synthetic arrivals.
//!
//! # Formats
//!
//! **Plain** (the documented format): one request a line, `TIME KEY [SERVICE_MS]`.
//!
//! - `TIME`: seconds, a decimal number (Unix time or any other origin; only differences count).
//!   Lines need not be sorted: requests are replayed in time order (ties in file order).
//! - `KEY`: the placement key, as the gateway would compute it.
//! - `SERVICE_MS` (optional): how long a cache miss of this request takes to serve, in ms (a hit
//!   takes the model's hit time); without it, the model's miss time.
//! - Fields are separated by tabs when the line has one (so keys may contain spaces), else by
//!   runs of spaces. Empty lines and lines starting with `#` are skipped.
//!
//! **Combined**: nginx's (and Apache's) `combined` access-log format,
//! `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"`,
//! with a key template in the gateway's own key language ([`keyroute::key`], so the key of a
//! logged request is the one the gateway computes for it): `{path}`, `{uri}`, `{query.NAME}`,
//! `{method}`, `{client_ip}`, `{{`/`}}` and literal text (default `{uri}`); `{host}`, `{header.*}`
//! and `{cookie.*}` are not in a log, and a line needing them is an error. Its times are whole seconds: the
//! requests logged in one second are spread evenly over it, in file order. A request logged as
//! `"-"` (nginx's record of a connection that sent no request, such as a 400) reached no backend:
//! it is counted in [`Trace::skipped`] and not replayed.
//!
//! Either may be gzip-compressed (detected by its magic bytes). A line that cannot be read is an
//! error naming the file and line; nothing is skipped silently.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use keyroute::key::{KeyTemplate, LoggedRequest};

/// A request log, ready to replay: times relative to the first request, keys as dense ids.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Arrival times in nanoseconds from the first request, ascending.
    pub times_ns: Vec<u64>,
    /// Each request's key id: an index into `catalogue`.
    pub keys: Vec<u32>,
    /// Each request's miss service time in ms, when the log gives it.
    pub service_ms: Option<Vec<f32>>,
    /// The distinct keys, by id, in order of first appearance.
    pub catalogue: Vec<Vec<u8>>,
    /// Lines that record no request (a combined log's `"-"`), not replayed.
    pub skipped: u64,
}

/// How a log's lines are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// `TIME KEY [SERVICE_MS]`.
    Plain,
    /// nginx's `combined` log, keys made by the template.
    Combined {
        /// The key template.
        template: String,
    },
}

/// Why a log could not be read.
#[derive(Debug)]
pub struct TraceError {
    /// The file.
    pub file: String,
    /// The line (1-based), when the problem is on one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

impl Trace {
    /// The number of requests.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the log has no request.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Seconds from the first request to the last.
    pub fn duration_s(&self) -> f64 {
        self.times_ns.last().map_or(0.0, |&t| t as f64 / 1e9)
    }

    /// The requests per key id.
    pub fn counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.catalogue.len()];
        for &k in &self.keys {
            c[k as usize] += 1;
        }
        c
    }

    /// The index of the first request at or after `seconds` from the start.
    pub fn index_at(&self, seconds: f64) -> usize {
        let t = (seconds.max(0.0) * 1e9) as u64;
        self.times_ns.partition_point(|&x| x < t)
    }

    /// Reads a log file (gzip or not).
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not valid gzip, or a line is malformed (named by number).
    pub fn read(path: &Path, format: &TraceFormat) -> Result<Trace, TraceError> {
        let file = path.display().to_string();
        let err = |line: Option<usize>, message: String| TraceError { file: file.clone(), line, message };
        let raw = std::fs::read(path).map_err(|e| err(None, format!("cannot read it: {e}")))?;
        let text = if raw.starts_with(&[0x1f, 0x8b]) {
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_end(&mut out)
                .map_err(|e| err(None, format!("not valid gzip: {e}")))?;
            out
        } else {
            raw
        };
        Trace::parse(&text, format).map_err(|(line, message)| err(line, message))
    }

    /// Parses a log's text.
    ///
    /// # Errors
    ///
    /// `(line, message)` for the first malformed line, or `(None, message)` for an empty log or an
    /// invalid template.
    pub fn parse(text: &[u8], format: &TraceFormat) -> Result<Trace, (Option<usize>, String)> {
        let template = match format {
            TraceFormat::Plain => None,
            TraceFormat::Combined { template } => {
                Some(KeyTemplate::parse(template, &[]).map_err(|e| (None, format!("key template '{template}': {e}")))?)
            }
        };
        // (time in ns since the epoch of the log, file order, key, service)
        let mut rows: Vec<(i128, u32, Vec<u8>, Option<f32>)> = Vec::new();
        let mut any_service = false;
        let mut skipped = 0u64;
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || line.starts_with(b"#") {
                continue;
            }
            let lineno = n + 1;
            let (t, key, service) = match &template {
                None => plain_line(line),
                Some(t) => match combined_line(line, t) {
                    Ok(Some((t, k))) => Ok((t, k, None)),
                    Ok(None) => {
                        skipped += 1;
                        continue;
                    }
                    Err(e) => Err(e),
                },
            }
            .map_err(|m| (Some(lineno), m))?;
            any_service |= service.is_some();
            if any_service && service.is_none() {
                return Err((Some(lineno), "a service time is missing (give it on every line or none)".into()));
            }
            rows.push((t, rows.len() as u32, key, service));
            if rows.len() > u32::MAX as usize - 1 {
                return Err((Some(lineno), "more than 4 billion requests".into()));
            }
        }
        if rows.is_empty() {
            return Err((None, "no request in the log".into()));
        }
        if any_service && rows.iter().any(|r| r.3.is_none()) {
            return Err((None, "a service time is missing on a line before the first that has one".into()));
        }
        rows.sort_by_key(|r| (r.0, r.1));
        if template.is_some() {
            // Whole seconds: spread each second's requests evenly over it, in file order.
            let mut i = 0;
            while i < rows.len() {
                let j = i + rows[i..].partition_point(|r| r.0 == rows[i].0);
                let n = (j - i) as i128;
                for (k, r) in rows[i..j].iter_mut().enumerate() {
                    r.0 += k as i128 * 1_000_000_000 / n;
                }
                i = j;
            }
        }
        let t0 = rows[0].0;
        let span = rows[rows.len() - 1].0 - t0;
        if span > 100 * 365 * 86_400 * 1_000_000_000i128 {
            return Err((
                None,
                format!("the log spans {} years: are its times in seconds?", span / (365 * 86_400 * 1_000_000_000)),
            ));
        }
        let mut ids: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut trace = Trace { service_ms: any_service.then(Vec::new), skipped, ..Trace::default() };
        for (t, _, key, service) in rows {
            let next = trace.catalogue.len() as u32;
            let id = *ids.entry(key).or_insert_with_key(|k| {
                trace.catalogue.push(k.clone());
                next
            });
            trace.times_ns.push(u64::try_from(t - t0).unwrap_or(u64::MAX));
            trace.keys.push(id);
            if let (Some(s), Some(v)) = (&mut trace.service_ms, service) {
                s.push(v);
            }
        }
        Ok(trace)
    }
}

/// Seconds (a decimal) as nanoseconds.
fn seconds_ns(field: &[u8]) -> Result<i128, String> {
    let text = std::str::from_utf8(field).map_err(|_| "the time is not a number".to_owned())?;
    let v: f64 = text.parse().map_err(|_| format!("the time '{text}' is not a number of seconds"))?;
    if !v.is_finite() || v.abs() > 1e13 {
        return Err(format!("the time '{text}' is out of range"));
    }
    Ok((v * 1e9).round() as i128)
}

fn plain_line(line: &[u8]) -> Result<(i128, Vec<u8>, Option<f32>), String> {
    let fields: Vec<&[u8]> = if line.contains(&b'\t') {
        line.split(|&b| b == b'\t').collect()
    } else {
        line.split(|&b| b == b' ').filter(|f| !f.is_empty()).collect()
    };
    let (time, key, service) = match fields.as_slice() {
        [t, k] => (t, k, None),
        [t, k, s] => (t, k, Some(s)),
        _ => return Err(format!("expected TIME KEY [SERVICE_MS], got {} fields", fields.len())),
    };
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    let service = match service {
        None => None,
        Some(s) => {
            let text = std::str::from_utf8(s).unwrap_or("");
            match text.parse::<f32>() {
                Ok(v) if v.is_finite() && v > 0.0 && v < 3.6e6 => Some(v),
                _ => {
                    return Err(format!(
                        "the service time '{}' is not a number of ms in (0, 3600000)",
                        text.escape_debug()
                    ));
                }
            }
        }
    };
    Ok((seconds_ns(time)?, key.to_vec(), service))
}

/// A combined-log line's time (ns since the Unix epoch) and key; `None` for a line that records
/// no request (`"-"`).
fn combined_line(line: &[u8], template: &KeyTemplate) -> Result<Option<(i128, Vec<u8>)>, String> {
    let text = String::from_utf8_lossy(line);
    let client = text.split(' ').next().unwrap_or("");
    let open = text.find('[').ok_or("no [time] field")?;
    let close = text[open..].find(']').map(|c| open + c).ok_or("no ] after the time")?;
    let time = clf_time(&text[open + 1..close])?;
    let rest = &text[close + 1..];
    let q = rest.find('"').ok_or("no \"request\" field")?;
    let end = rest[q + 1..].find('"').map(|e| q + 1 + e).ok_or("the request field is not closed")?;
    if &rest[q + 1..end] == "-" {
        return Ok(None);
    }
    let mut request = rest[q + 1..end].split(' ');
    let method = request.next().unwrap_or("");
    let uri = request.next().ok_or("the request has no URI")?;
    // The gateway's key language: the simulator's key of a logged request is the gateway's key of
    // the request itself (a log has no host, headers or cookies).
    let logged = LoggedRequest { method, uri, client: client.parse().ok() };
    let mut key = String::new();
    template.render(&logged, &mut key).map_err(|e| format!("the key template has no value for '{uri}': {e}"))?;
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    Ok(Some((time, key.into_bytes())))
}

/// `10/Oct/2000:13:55:36 -0700` as nanoseconds since the Unix epoch.
fn clf_time(s: &str) -> Result<i128, String> {
    let bad = || format!("the time '{s}' is not like 10/Oct/2000:13:55:36 -0700");
    let (stamp, zone) = s.split_once(' ').ok_or_else(bad)?;
    let mut parts = stamp.split(['/', ':']);
    let mut next = || parts.next().ok_or_else(bad);
    let day: i64 = next()?.parse().map_err(|_| bad())?;
    let month: u8 = match next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return Err(bad()),
    };
    let year: i64 = next()?.parse().map_err(|_| bad())?;
    let (h, m, sec): (i64, i64, f64) =
        (next()?.parse().map_err(|_| bad())?, next()?.parse().map_err(|_| bad())?, next()?.parse().map_err(|_| bad())?);
    if !(1..=9999).contains(&year)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&h)
        || !(0..60).contains(&m)
        || !(0.0..61.0).contains(&sec)
    {
        return Err(bad());
    }
    let zone = zone.trim();
    let sign = match zone.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let digits = zone.get(1..5).filter(|d| d.bytes().all(|b| b.is_ascii_digit())).ok_or_else(bad)?;
    let offset = sign
        * (digits[..2].parse::<i64>().map_err(|_| bad())? * 3600 + digits[2..].parse::<i64>().map_err(|_| bad())? * 60);
    let month = time::Month::try_from(month).map_err(|_| bad())?;
    let date = time::Date::from_calendar_date(year as i32, month, day as u8).map_err(|_| bad())?;
    let days = i64::from(date.to_julian_day()) - UNIX_EPOCH_JULIAN_DAY;
    let secs = days * 86_400 + h * 3600 + m * 60 - offset;
    Ok(i128::from(secs) * 1_000_000_000 + (sec * 1e9).round() as i128)
}

/// The Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i64 = 2_440_588;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_logs_sort_by_time_and_number_keys() {
        let t = Trace::parse(b"# a comment\n10.5 b\n10.0 a\n\n11 b\n10.5 c\n", &TraceFormat::Plain).expect("valid");
        assert_eq!(t.catalogue, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(t.keys, vec![0, 1, 2, 1]);
        assert_eq!(t.times_ns, vec![0, 500_000_000, 500_000_000, 1_000_000_000]);
        assert_eq!(t.counts(), vec![1, 2, 1]);
        assert_eq!(t.index_at(0.6), 3);
        let tabs = Trace::parse(b"1\ta key\t12.5\n2\tb\t3\n", &TraceFormat::Plain).expect("valid");
        assert_eq!(tabs.catalogue[0], b"a key");
        assert_eq!(tabs.service_ms, Some(vec![12.5, 3.0]));
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line, needle) in [
            (&b"1 a\nx b\n"[..], Some(2), "not a number"),
            (b"1 a b c\n", Some(1), "fields"),
            (b"1 a 0\n", Some(1), "service time"),
            (b"1 a 5\n2 b\n", Some(2), "missing"),
            (b"1 a\n9999999999 b\n", None, "years"),
            (b"# nothing\n", None, "no request"),
        ] {
            let (l, m) = Trace::parse(text, &TraceFormat::Plain).expect_err("invalid");
            assert_eq!(l, line, "{m}");
            assert!(m.contains(needle), "{m}");
        }
    }

    #[test]
    fn combined_logs_with_a_key_template() {
        let log =
            br#"10.0.0.1 - - [10/Oct/2000:13:55:36 -0700] "GET /thumb/a.jpg?w=160&h=90 HTTP/1.1" 200 2326 "-" "curl/8"
10.0.0.2 - frank [10/Oct/2000:13:55:37 -0700] "GET /thumb/b.jpg?w=80 HTTP/1.1" 200 99 "-" "x"
"#;
        let f = TraceFormat::Combined { template: "{path}?w={query.w}".into() };
        let t = Trace::parse(log, &f).expect("valid");
        assert_eq!(t.catalogue, vec![b"/thumb/a.jpg?w=160".to_vec(), b"/thumb/b.jpg?w=80".to_vec()]);
        assert_eq!(t.times_ns, vec![0, 1_000_000_000]);
        // Three requests in one second are spread over it; a "-" request is skipped, and counted.
        let same = br#"1.1.1.1 - - [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 1 "-" "x"
1.1.1.1 - - [10/Oct/2000:13:55:36 -0700] "-" 400 0 "-" "-"
1.1.1.1 - - [10/Oct/2000:13:55:36 -0700] "GET /b HTTP/1.1" 200 1 "-" "x"
1.1.1.1 - - [10/Oct/2000:13:55:36 -0700] "GET /c HTTP/1.1" 200 1 "-" "x"
"#;
        let t = Trace::parse(same, &TraceFormat::Combined { template: "{uri}".into() }).expect("valid");
        assert_eq!(t.times_ns, vec![0, 333_333_333, 666_666_666]);
        assert_eq!(t.skipped, 1);
        assert!(clf_time("10/Oct/300000000000:13:55:36 -0700").is_err());
        // 10/Oct/2000:13:55:36 -0700 is 971211336 s after the epoch.
        assert_eq!(clf_time("10/Oct/2000:13:55:36 -0700"), Ok(971_211_336_000_000_000));
        assert_eq!(clf_time("01/Jan/1970:00:00:00 +0000"), Ok(0));
        let (l, m) = Trace::parse(b"10.0.0.1 - - [bad] \"GET / HTTP/1.1\" 200 1\n", &f).expect_err("invalid");
        assert_eq!(l, Some(1), "{m}");
        let missing = TraceFormat::Combined { template: "{query.k}".into() };
        assert!(Trace::parse(log, &missing).is_err());
        assert!(Trace::parse(log, &TraceFormat::Combined { template: "{host}".into() }).is_err());
    }
}
