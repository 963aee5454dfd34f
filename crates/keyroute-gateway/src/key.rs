//! Key templates over HTTP requests: the core's one key language ([`keyroute::key`], shared with
//! the simulator), read from a request head and its client's address.
//!
//! See [`keyroute::key`] for the placeholders (`{path}`, `{query.NAME}`, `{header.NAME}`,
//! `{cookie.NAME}`, `{client_ip}`, `{host}`, `{method}`, `{uri}`) and the normalisations
//! (`lowercase`, `decode`, `first-value`).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName};
use http::request::Parts;
use http::{Method, Uri};
pub use keyroute::key::{KeyTemplate, MissingPart, Request, TemplateError, percent_decode, query_value};

use crate::head::{Fields, ReqHead, text};

/// A request head and its client, as a key template reads them.
#[derive(Clone, Copy, Debug)]
pub struct HttpRequest<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: Headers<'a>,
    client: IpAddr,
}

/// A head's fields, in either form.
#[derive(Clone, Copy, Debug)]
enum Headers<'a> {
    Map(&'a HeaderMap),
    Fields(&'a Fields),
}

impl<'a> Headers<'a> {
    fn get_all(self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        let (map, fields) = match self {
            Headers::Map(m) => (Some(m.get_all(name).iter().map(http::HeaderValue::as_bytes)), None),
            Headers::Fields(f) => (None, Some(f.get_all(name))),
        };
        map.into_iter().flatten().chain(fields.into_iter().flatten())
    }
}

impl<'a> HttpRequest<'a> {
    /// The view of `parts` from `client`.
    pub fn new(parts: &'a Parts, client: IpAddr) -> Self {
        HttpRequest { method: &parts.method, uri: &parts.uri, headers: Headers::Map(&parts.headers), client }
    }

    /// The view of a head on the request path from `client`.
    pub(crate) fn of(head: &'a ReqHead, client: IpAddr) -> Self {
        HttpRequest { method: &head.method, uri: &head.uri, headers: Headers::Fields(&head.fields), client }
    }
}

impl Request for HttpRequest<'_> {
    fn method(&self) -> &str {
        self.method.as_str()
    }
    fn path(&self) -> &str {
        self.uri.path()
    }
    fn query(&self) -> &str {
        self.uri.query().unwrap_or("")
    }
    fn path_and_query(&self) -> &str {
        self.uri.path_and_query().map_or("/", |p| p.as_str())
    }
    fn host(&self) -> Option<&str> {
        self.uri.host().or_else(|| self.headers.get_all(&header::HOST).next().and_then(text))
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        match self.headers {
            Headers::Map(m) => m.get(name).map(http::HeaderValue::as_bytes),
            Headers::Fields(f) => f.get_named(name),
        }
    }
    fn cookie(&self, name: &str) -> Option<&str> {
        self.headers.get_all(&header::COOKIE).filter_map(text).find_map(|line| keyroute::key::cookie_in(line, name))
    }
    fn client_ip(&self) -> Option<IpAddr> {
        Some(self.client)
    }
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
            "{method} {host}{path}?w={query.w}&h={query.h} {header.X-User} {cookie.sid} {client_ip} {{x}}",
            &[],
        )
        .expect("valid");
        let p = parts(
            "/thumb/cat.jpg?h=200&w=100",
            &[("host", "Img.Example"), ("x-user", "u1"), ("cookie", "a=1"), ("cookie", "sid=s9")],
        );
        let mut out = String::new();
        t.render(&HttpRequest::new(&p, "10.0.0.1".parse().expect("ip")), &mut out).expect("complete");
        assert_eq!(out, "GET img.example/thumb/cat.jpg?w=100&h=200 u1 s9 10.0.0.1 {x}");
    }

    #[test]
    fn missing_parts_are_named() {
        let t = KeyTemplate::parse("{path}:{query.w}", &[]).expect("valid");
        let mut out = String::new();
        let p = parts("/a?h=1", &[]);
        let err = t.render(&HttpRequest::new(&p, "::1".parse().expect("ip")), &mut out).expect_err("missing");
        assert_eq!(err, MissingPart("query.w".into()));
    }

    /// The gateway's key of a request is the simulator's key of its log line (one language).
    #[test]
    fn a_logged_request_has_the_key_of_the_live_one() {
        let t = KeyTemplate::parse("{method}:{path}?w={query.w}@{client_ip}", &["decode".into(), "lowercase".into()])
            .expect("valid");
        for uri in ["/Thumb/A%20B.jpg?w=100&h=2", "/x?w=", "/%zz?h=1&w=%41", "/?w=1"] {
            let p = parts(uri, &[("host", "a.example")]);
            let ip: IpAddr = "10.1.2.3".parse().expect("ip");
            let (mut live, mut logged) = (String::new(), String::new());
            let a = t.render(&HttpRequest::new(&p, ip), &mut live);
            let log = keyroute::key::LoggedRequest { method: "GET", uri, client: Some(ip) };
            let b = t.render(&log, &mut logged);
            assert_eq!((a, live), (b, logged), "{uri}");
        }
    }
}
