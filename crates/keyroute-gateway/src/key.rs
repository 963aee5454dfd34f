//! Key templates: which parts of a request make its placement key.
//!
//! A template is literal text with placeholders: `{path}`, `{query.NAME}`, `{header.NAME}`,
//! `{cookie.NAME}`, `{client_ip}`, `{host}`, `{method}`, `{uri}` (path and query). `{{` and `}}`
//! are literal braces. The thumbnail service's key is `{path}?w={query.w}&h={query.h}`: the same
//! image at the same size is the same key, so it lands on the worker that has it cached.
//!
//! A placeholder whose part is absent (no such query parameter, header or cookie) makes the key
//! *missing*; the pool then either falls back to power of two choices or rejects the request with
//! 400, as configured. Optional normalisations apply to the rendered key: `lowercase`, `decode`
//! (percent-decoding of path and query values, so `a%20b` and `a b` are one key), and
//! `first-value` (a header's first comma-separated value, trimmed, as HAProxy's `hdr()` hashes
//! it). Header values are taken as UTF-8 (a value that is not is missing).

use std::net::IpAddr;

use http::HeaderName;
use http::request::Parts;

/// A parsed key template. See the [module documentation](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    parts: Vec<Part>,
    lowercase: bool,
    decode: bool,
    first_value: bool,
    source: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Path,
    Uri,
    Host,
    Method,
    ClientIp,
    Query(String),
    Header(HeaderName),
    Cookie(String),
}

/// Why a key template was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template text itself (an unknown placeholder, an unclosed `{`, a bad header name).
    #[error("{0}")]
    Template(String),
    /// A normalisation name.
    #[error("{0}")]
    Normalize(String),
}

/// A template part the request did not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingPart(pub String);

impl KeyTemplate {
    /// Parses a template with the given normalisations (`lowercase`, `decode`).
    ///
    /// # Errors
    ///
    /// An unknown placeholder, an unclosed `{`, an invalid header name, or an unknown normalisation,
    /// as a message naming it.
    pub fn parse(template: &str, normalize: &[String]) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(TemplateError::Template("unmatched '}' (write '}}' for a literal brace)".into())),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(TemplateError::Template(format!("unclosed placeholder '{{{name}'"))),
                        }
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut lit)));
                    }
                    parts.push(placeholder(&name).map_err(TemplateError::Template)?);
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Literal(lit));
        }
        let (mut lowercase, mut decode, mut first_value) = (false, false, false);
        for n in normalize {
            match n.as_str() {
                "lowercase" => lowercase = true,
                "decode" => decode = true,
                "first-value" => first_value = true,
                other => {
                    return Err(TemplateError::Normalize(format!(
                        "unknown normalisation '{other}' (expected lowercase, decode or first-value)"
                    )));
                }
            }
        }
        Ok(KeyTemplate { parts, lowercase, decode, first_value, source: template.to_owned() })
    }

    /// Whether the key reads more of a request than its method, host and URL: a header, a cookie
    /// or the client's address (the gateway cache then varies on the rendered key).
    pub fn reads_beyond_url(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Header(_) | Part::Cookie(_) | Part::ClientIp))
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Renders the key of a request into `out` (cleared first).
    ///
    /// # Errors
    ///
    /// The first placeholder whose part the request lacks.
    pub fn render(&self, req: &Parts, client: IpAddr, out: &mut String) -> Result<(), MissingPart> {
        out.clear();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Path => self.push(out, req.uri.path()),
                Part::Uri => self.push(out, req.uri.path_and_query().map_or("/", |p| p.as_str())),
                Part::Method => out.push_str(req.method.as_str()),
                Part::ClientIp => out.push_str(&client.to_string()),
                Part::Host => {
                    let host =
                        req.uri.host().or_else(|| req.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()));
                    match host {
                        Some(h) => out.push_str(&h.to_ascii_lowercase()),
                        None => return Err(MissingPart("host".into())),
                    }
                }
                Part::Query(name) => match query_value(req.uri.query().unwrap_or(""), name) {
                    Some(v) => self.push(out, v),
                    None => return Err(MissingPart(format!("query.{name}"))),
                },
                Part::Header(name) => {
                    match req.headers.get(name).and_then(|v| std::str::from_utf8(v.as_bytes()).ok()) {
                        Some(v) if self.first_value => {
                            let first = keyroute::compat::haproxy::first_value(v.as_bytes());
                            // A byte slice of a str cut at ASCII bytes (comma, space, tab): still UTF-8.
                            out.push_str(std::str::from_utf8(first).unwrap_or_default());
                        }
                        Some(v) => out.push_str(v),
                        None => return Err(MissingPart(format!("header.{name}"))),
                    }
                }
                Part::Cookie(name) => match cookie_value(req, name) {
                    Some(v) => out.push_str(v),
                    None => return Err(MissingPart(format!("cookie.{name}"))),
                },
            }
        }
        if self.lowercase {
            *out = out.to_lowercase();
        }
        Ok(())
    }

    fn push(&self, out: &mut String, raw: &str) {
        if self.decode { out.push_str(&percent_decode(raw)) } else { out.push_str(raw) }
    }
}

fn placeholder(name: &str) -> Result<Part, String> {
    let known = "{path}, {uri}, {host}, {method}, {client_ip}, {query.NAME}, {header.NAME}, {cookie.NAME}";
    Ok(match name {
        "path" => Part::Path,
        "uri" => Part::Uri,
        "host" => Part::Host,
        "method" => Part::Method,
        "client_ip" => Part::ClientIp,
        _ => {
            if let Some(q) = name.strip_prefix("query.").filter(|q| !q.is_empty()) {
                Part::Query(q.to_owned())
            } else if let Some(h) = name.strip_prefix("header.").filter(|h| !h.is_empty()) {
                Part::Header(HeaderName::try_from(h).map_err(|_| format!("invalid header name '{h}' in {{{name}}}"))?)
            } else if let Some(c) = name.strip_prefix("cookie.").filter(|c| !c.is_empty()) {
                Part::Cookie(c.to_owned())
            } else {
                return Err(format!("unknown placeholder '{{{name}}}' (expected one of {known})"));
            }
        }
    })
}

/// The first value of query parameter `name` (raw, not decoded). `a` in `?a&b=1` has value "".
pub fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

fn cookie_value<'r>(req: &'r Parts, name: &str) -> Option<&'r str> {
    req.headers.get_all(http::header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|line| {
        line.split(';').find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == name).then_some(v)
        })
    })
}

/// Percent-decoding (and `+` as space in query values is left alone: it is a literal `+` in paths).
/// Invalid escapes are kept as written; invalid UTF-8 is replaced.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn renders_every_placeholder() {
        let t = KeyTemplate::parse(
            "{method} {host}{path}?w={query.w}&h={query.h} {header.x-user} {cookie.sid} {client_ip} {{x}}",
            &[],
        )
        .expect("valid");
        let p = parts(
            "/thumb/cat.jpg?h=200&w=100",
            &[("host", "Img.Example"), ("x-user", "u1"), ("cookie", "a=1; sid=s9")],
        );
        let mut out = String::new();
        t.render(&p, "10.0.0.1".parse().expect("ip"), &mut out).expect("complete");
        assert_eq!(out, "GET img.example/thumb/cat.jpg?w=100&h=200 u1 s9 10.0.0.1 {x}");
    }

    #[test]
    fn missing_parts_are_named() {
        let t = KeyTemplate::parse("{path}:{query.w}", &[]).expect("valid");
        let mut out = String::new();
        let err = t.render(&parts("/a?h=1", &[]), "::1".parse().expect("ip"), &mut out).expect_err("missing");
        assert_eq!(err, MissingPart("query.w".into()));
    }

    #[test]
    fn normalisations() {
        let t = KeyTemplate::parse("{path}", &["lowercase".into(), "decode".into()]).expect("valid");
        let mut out = String::new();
        t.render(&parts("/A%20B/%zz", &[]), "::1".parse().expect("ip"), &mut out).expect("ok");
        assert_eq!(out, "/a b/%zz");
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, needle) in [
            ("{nope}", "unknown placeholder '{nope}'"),
            ("{path", "unclosed"),
            ("a}", "unmatched"),
            ("{header.bad name}", "invalid header name"),
            ("{query.}", "unknown placeholder"),
        ] {
            let err = KeyTemplate::parse(t, &[]).expect_err(t);
            assert!(matches!(&err, TemplateError::Template(m) if m.contains(needle)), "{t}: {err}");
        }
        assert!(matches!(KeyTemplate::parse("{path}", &["upper".into()]), Err(TemplateError::Normalize(_))));
    }
}
