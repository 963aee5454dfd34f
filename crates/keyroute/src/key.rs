//! Key templates: which parts of a request make its placement key, one language for the gateway
//! (over live HTTP requests) and the simulator (over logged ones), so that the simulator's key of
//! a logged request is the gateway's key of the same request.
//!
//! A template is literal text with placeholders: `{path}`, `{query.NAME}`, `{header.NAME}`,
//! `{cookie.NAME}`, `{client_ip}`, `{host}`, `{method}`, `{uri}` (path and query), and for gRPC
//! calls (whose path is `/package.Service/Method`) `{grpc.service}` (`package.Service`) and
//! `{grpc.method}` (`package.Service/Method`, the full method name). `{{` and `}}` are literal
//! braces. The thumbnail service's key is `{path}?w={query.w}&h={query.h}`: the same
//! image at the same size is the same key, so it lands on the worker that has it cached.
//!
//! A placeholder whose part is absent (no such query parameter, header or cookie; a logged request
//! has no headers) makes the key *missing*; the gateway then either falls back to power of two
//! choices or rejects the request with 400, as configured, and the simulator refuses the line.
//! Optional normalisations apply to the rendered key: `lowercase`, `decode` (percent-decoding of
//! path and query values, so `a%20b` and `a b` are one key; invalid escapes are kept as written,
//! invalid UTF-8 replaced), and `first-value` (a header's first comma-separated value, trimmed, as
//! HAProxy's `hdr()` hashes it). Header values are taken as UTF-8 (a value that is not is
//! missing).
//!
//! The request is anything that implements [`Request`]: the library knows no HTTP types.

use std::borrow::Cow;
use std::net::IpAddr;

/// What a key template reads of a request. Header names are asked for in lowercase.
pub trait Request {
    /// The method (`GET`).
    fn method(&self) -> &str;
    /// The path, without the query.
    fn path(&self) -> &str;
    /// The query, without its `?` (empty when there is none).
    fn query(&self) -> &str;
    /// The path and query as the request carried them.
    fn path_and_query(&self) -> &str;
    /// The host (the target's authority, else the Host header), if any.
    fn host(&self) -> Option<&str>;
    /// The first value of a header, if any.
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// The value of a cookie, if any (see [`cookie_in`]).
    fn cookie(&self, name: &str) -> Option<&str>;
    /// The client's address, if known.
    fn client_ip(&self) -> Option<IpAddr>;
}

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
    /// Lowercase.
    Header(String),
    Cookie(String),
    /// `package.Service` of a gRPC path.
    GrpcService,
    /// `package.Service/Method` of a gRPC path.
    GrpcMethod,
}

/// Why a key template was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateError {
    /// The template text itself (an unknown placeholder, an unclosed `{`, a bad header name).
    Template(String),
    /// A normalisation name.
    Normalize(String),
}

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateError::Template(m) | TemplateError::Normalize(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TemplateError {}

/// A template part the request did not have (`query.w`, `header.x-user`, `host`...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingPart(pub String);

impl std::fmt::Display for MissingPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request has no {}", self.0)
    }
}

impl std::error::Error for MissingPart {}

impl KeyTemplate {
    /// Parses a template with the given normalisations (`lowercase`, `decode`, `first-value`).
    ///
    /// # Errors
    ///
    /// An unknown placeholder, an unclosed `{`, an invalid header name, or an unknown
    /// normalisation, as a message naming it.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyroute::key::KeyTemplate;
    ///
    /// let t = KeyTemplate::parse("{path}?w={query.w}", &[])?;
    /// assert_eq!(t.as_str(), "{path}?w={query.w}");
    /// assert!(KeyTemplate::parse("{nope}", &[]).is_err());
    /// # Ok::<(), keyroute::key::TemplateError>(())
    /// ```
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

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the key reads more of a request than its method, host and URL: a header, a cookie
    /// or the client's address (a cache keyed by URL must then vary on the rendered key).
    pub fn reads_beyond_url(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Header(_) | Part::Cookie(_) | Part::ClientIp))
    }

    /// Renders the key of a request into `out` (cleared first).
    ///
    /// # Errors
    ///
    /// The first placeholder whose part the request lacks.
    pub fn render(&self, req: &impl Request, out: &mut String) -> Result<(), MissingPart> {
        out.clear();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Path => self.push(out, req.path()),
                Part::Uri => self.push(out, req.path_and_query()),
                Part::Method => out.push_str(req.method()),
                Part::GrpcService => match grpc_method(req.path()) {
                    Some((service, _)) => out.push_str(service),
                    None => return Err(MissingPart("grpc.service (the path is not /package.Service/Method)".into())),
                },
                Part::GrpcMethod => match grpc_method(req.path()) {
                    Some((service, method)) => {
                        out.push_str(service);
                        out.push('/');
                        out.push_str(method);
                    }
                    None => return Err(MissingPart("grpc.method (the path is not /package.Service/Method)".into())),
                },
                Part::ClientIp => match req.client_ip() {
                    Some(ip) => {
                        use std::fmt::Write as _;
                        let _ = write!(out, "{ip}");
                    }
                    None => return Err(MissingPart("client_ip".into())),
                },
                Part::Host => match req.host() {
                    Some(h) => out.push_str(&h.to_ascii_lowercase()),
                    None => return Err(MissingPart("host".into())),
                },
                Part::Query(name) => match query_value(req.query(), name) {
                    Some(v) => self.push(out, v),
                    None => return Err(MissingPart(format!("query.{name}"))),
                },
                Part::Header(name) => match req.header(name).and_then(|v| std::str::from_utf8(v).ok()) {
                    Some(v) if self.first_value => {
                        let first = crate::compat::haproxy::first_value(v.as_bytes());
                        // A byte slice of a str cut at ASCII bytes (comma, space, tab): still UTF-8.
                        out.push_str(std::str::from_utf8(first).unwrap_or_default());
                    }
                    Some(v) => out.push_str(v),
                    None => return Err(MissingPart(format!("header.{name}"))),
                },
                Part::Cookie(name) => match req.cookie(name) {
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
    let known = "{path}, {uri}, {host}, {method}, {client_ip}, {query.NAME}, {header.NAME}, {cookie.NAME}, {grpc.service}, {grpc.method}";
    Ok(match name {
        "grpc.service" => Part::GrpcService,
        "grpc.method" => Part::GrpcMethod,
        "path" => Part::Path,
        "uri" => Part::Uri,
        "host" => Part::Host,
        "method" => Part::Method,
        "client_ip" => Part::ClientIp,
        _ => {
            if let Some(q) = name.strip_prefix("query.").filter(|q| !q.is_empty()) {
                Part::Query(q.to_owned())
            } else if let Some(h) = name.strip_prefix("header.").filter(|h| !h.is_empty()) {
                if !h.bytes().all(is_token_byte) {
                    return Err(format!("invalid header name '{h}' in {{{name}}}"));
                }
                Part::Header(h.to_ascii_lowercase())
            } else if let Some(c) = name.strip_prefix("cookie.").filter(|c| !c.is_empty()) {
                Part::Cookie(c.to_owned())
            } else {
                return Err(format!("unknown placeholder '{{{name}}}' (expected one of {known})"));
            }
        }
    })
}

/// The service and method of a gRPC call's path (`/package.Service/Method`): two non-empty
/// segments, nothing more.
fn grpc_method(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/')).then_some((service, method))
}

/// A byte of an HTTP token (RFC 9110 §5.6.2): what a header name is made of.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The first value of query parameter `name` (raw, not decoded). `a` in `?a&b=1` has value "".
pub fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

/// The value of cookie `name` in one `Cookie` header line (`a=1; sid=s9`), as RFC 6265 §5.4
/// writes it.
pub fn cookie_in<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    line.split(';').find_map(|c| {
        let (k, v) = c.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// Percent-decoding as the `decode` normalisation does it (`+` stays a `+`: it is a literal `+`
/// in paths). Invalid escapes are kept as written; invalid UTF-8 is replaced.
pub fn percent_decode(s: &str) -> Cow<'_, str> {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy()
}

/// A request as a log line records it: method, path and query, and the client's address; no
/// host, headers or cookies.
#[derive(Clone, Copy, Debug)]
pub struct LoggedRequest<'a> {
    /// The method.
    pub method: &'a str,
    /// The path and query.
    pub uri: &'a str,
    /// The client's address, if the log has one.
    pub client: Option<IpAddr>,
}

impl Request for LoggedRequest<'_> {
    fn method(&self) -> &str {
        self.method
    }
    fn path(&self) -> &str {
        self.uri.split_once('?').map_or(self.uri, |(p, _)| p)
    }
    fn query(&self) -> &str {
        self.uri.split_once('?').map_or("", |(_, q)| q)
    }
    fn path_and_query(&self) -> &str {
        if self.uri.is_empty() { "/" } else { self.uri }
    }
    fn host(&self) -> Option<&str> {
        None
    }
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
    fn cookie(&self, _: &str) -> Option<&str> {
        None
    }
    fn client_ip(&self) -> Option<IpAddr> {
        self.client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_logged_request() {
        let t = KeyTemplate::parse("{method} {path}?w={query.w} {client_ip} {{x}}", &[]).expect("valid");
        let r = LoggedRequest { method: "GET", uri: "/a/b.jpg?h=2&w=1", client: "10.0.0.1".parse().ok() };
        let mut out = String::from("stale");
        t.render(&r, &mut out).expect("complete");
        assert_eq!(out, "GET /a/b.jpg?w=1 10.0.0.1 {x}");
        let host = KeyTemplate::parse("{host}{path}", &[]).expect("valid");
        assert_eq!(host.render(&r, &mut out), Err(MissingPart("host".into())));
    }

    #[test]
    fn normalisations() {
        let t = KeyTemplate::parse("{path}", &["lowercase".into(), "decode".into()]).expect("valid");
        let mut out = String::new();
        let r = LoggedRequest { method: "GET", uri: "/A%20B/%zz/%e2%82%ac/%ff", client: None };
        t.render(&r, &mut out).expect("ok");
        assert_eq!(out, "/a b/%zz/€/\u{fffd}");
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
            let e = KeyTemplate::parse(t, &[]).expect_err("refused");
            assert!(e.to_string().contains(needle), "{t}: {e}");
        }
        assert!(matches!(KeyTemplate::parse("{path}", &["upper".into()]), Err(TemplateError::Normalize(_))));
    }

    #[test]
    fn grpc_parts_are_the_service_and_the_full_method() {
        let t = KeyTemplate::parse("{grpc.method}|{grpc.service}", &[]).expect("valid");
        let mut out = String::new();
        let call = |uri| LoggedRequest { method: "POST", uri, client: None };
        t.render(&call("/shop.v1.Cart/Get"), &mut out).expect("a gRPC path");
        assert_eq!(out, "shop.v1.Cart/Get|shop.v1.Cart");
        for not_grpc in ["/", "/shop.v1.Cart", "/shop.v1.Cart/", "//Get", "/a/b/c"] {
            let e = t.render(&call(not_grpc), &mut out).expect_err(not_grpc);
            assert!(e.0.starts_with("grpc.method"), "{not_grpc}: {e}");
        }
    }

    #[test]
    fn cookies_and_queries() {
        assert_eq!(cookie_in("a=1; sid=s9", "sid"), Some("s9"));
        assert_eq!(cookie_in("a=1;sid", "sid"), None);
        assert_eq!(query_value("a&b=1", "a"), Some(""));
        assert_eq!(query_value("ab=1", "a"), None);
    }
}
