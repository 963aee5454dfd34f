//! Who may talk to the admin API: the checks every admin request passes before its path is
//! matched, as pure functions of the request head (no socket, no clock).
//!
//! 1. **Not through a gateway.** A request carrying a keyroute gateway's `Via` entry came through
//!    some gateway's public listener (a member record can point a pool at an admin port): 403,
//!    whatever this gateway's own addresses are. The API is for operators, not for proxied clients.
//! 2. **Host** (DNS rebinding). A browser that was made to resolve `rebind.attacker.example` to the
//!    admin address still sends `Host: rebind.attacker.example`: only the admin listener's own
//!    address, an IP literal when it listens on every address, `localhost`, and the names in
//!    `admin.hosts` are served; anything else gets 421. A request with no Host (not a browser) is
//!    served.
//! 3. **Origin** (CSRF). A page on another origin can make a browser send a request, though it
//!    cannot read the answer. A request whose `Origin` is not one of the hosts above, or whose
//!    `Sec-Fetch-Site` says `cross-site` or `same-site` (another port of `localhost` is the same
//!    site), gets 403. A request with a body must say `Content-Type: application/json` (415
//!    otherwise): a form or `text/plain` body is what a page can send without asking first.
//! 4. **Another site's page asking for a heavy GET** (issue 31, defect 17). The feed (`/events`,
//!    held open) and the placement what-if (`/placement`, a table built) cost more than an
//!    answer, and a page can make a browser ask for them with `<img>`, `<script>` or `<video>`
//!    tags, which send no `Origin`. Over plain http to a name (`admin.hosts`), which is not a
//!    potentially trustworthy origin, Chromium sends no Fetch Metadata either, so these are
//!    refused (403) by what the browser does send: `Sec-Fetch-Mode` other than `cors`,
//!    `same-origin` or `navigate`, or `Sec-Fetch-Dest` other than `empty` or `document` (sent to
//!    loopback, which is trustworthy); an `Accept` naming an image, audio, video, font or
//!    style sheet type (what an element asks for; `EventSource` sends `text/event-stream`,
//!    `fetch` `*/*`); a `Referer` naming a host the API does not answer to. The dashboard's own
//!    page sends none of these (it has `Referrer-Policy: no-referrer`), nor does a tool. What
//!    remains is a `<script>` or `<video>` tag on a page with `Referrer-Policy: no-referrer`:
//!    it sends what `curl` does, and is bounded by the feed's per-address cap.
//! 5. **Token.** When a token is configured, `Authorization: Bearer TOKEN` (the scheme in any case,
//!    RFC 9110 §11.1), compared in constant time. The right token always works: the failure
//!    throttle only answers wrong ones (an attacker who fails ten times from an operator's address
//!    must not lock the operator out), and a request with no credentials is always challenged
//!    (`Bearer`, and `Basic` on a line of its own for the dashboard and its feed).

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, Method, StatusCode, header};

/// Why an admin request was refused before its path was looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It came through a keyroute gateway's public listener.
    Proxied,
    /// Its Host is not one this API answers to.
    Host,
    /// It came from a page of another origin or site.
    CrossOrigin,
    /// A body that is not declared JSON.
    NotJson,
    /// A heavy GET that another site's page asked for (an element's request, a foreign Referer).
    CrossSite,
}

impl Refusal {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Refusal::Proxied | Refusal::CrossOrigin | Refusal::CrossSite => StatusCode::FORBIDDEN,
            Refusal::Host => StatusCode::MISDIRECTED_REQUEST,
            Refusal::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::Proxied => "the admin API is not served through a gateway",
            Refusal::Host => "this Host is not served by the admin API (see admin.hosts)",
            Refusal::CrossOrigin => "cross-origin requests to the admin API are refused",
            Refusal::NotJson => "the body must be sent with Content-Type: application/json",
            Refusal::CrossSite => "the feed and the placement are not served to another site's page",
        }
    }
}

/// The names and addresses the admin API answers to.
#[derive(Clone, Debug)]
pub(crate) struct Hosts {
    listen: SocketAddr,
    /// `admin.hosts`, lowercase.
    names: Vec<String>,
}

impl Hosts {
    pub(crate) fn new(listen: SocketAddr, names: &[String]) -> Hosts {
        Hosts { listen, names: names.iter().map(|n| n.to_ascii_lowercase()).collect() }
    }

    /// Whether `authority` (`host`, `host:port`, `[v6]:port`) names this API.
    fn allows(&self, authority: &str) -> bool {
        let host = host_part(authority).to_ascii_lowercase();
        if host.is_empty() {
            return false;
        }
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            // An IP literal cannot be rebound: it is the listener's own address, or any local
            // address when the listener takes them all.
            let own = self.listen.ip();
            return own.is_unspecified() || ip == own || (own.is_loopback() && ip.is_loopback());
        }
        host == "localhost" || host.ends_with(".localhost") || self.names.contains(&host)
    }
}

/// The host of an authority, without its port (`[::1]:9901` -> `[::1]`).
fn host_part(authority: &str) -> &str {
    let a = authority.trim();
    if a.starts_with('[') {
        return a.find(']').map_or(a, |i| &a[..=i]);
    }
    match a.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !h.contains(':') => h,
        _ => a,
    }
}

/// Whether a `Via` header names a keyroute gateway (`1.1 keyroute-<id>`).
fn through_gateway(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VIA)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|entry| entry.trim_ascii().split(|b| b.is_ascii_whitespace()).nth(1))
        .any(|by| by.len() >= 8 && by[..8].eq_ignore_ascii_case(b"keyroute"))
}

/// Checks 1 to 3 for one request.
///
/// # Errors
///
/// The first rule the request breaks.
pub(crate) fn check(hosts: &Hosts, method: &Method, headers: &HeaderMap) -> Result<(), Refusal> {
    if through_gateway(headers) {
        return Err(Refusal::Proxied);
    }
    let mut host_values = headers.get_all(header::HOST).iter();
    if let Some(h) = host_values.next()
        && (host_values.next().is_some() || !h.to_str().is_ok_and(|h| hosts.allows(h)))
    {
        return Err(Refusal::Host);
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && !(site.as_bytes().eq_ignore_ascii_case(b"same-origin") || site.as_bytes().eq_ignore_ascii_case(b"none"))
    {
        return Err(Refusal::CrossOrigin);
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")))
            .is_some_and(|authority| !authority.contains('/') && hosts.allows(authority));
        if !ok {
            return Err(Refusal::CrossOrigin);
        }
    }
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().ok().and_then(|n| n.trim().parse::<u64>().ok()) != Some(0));
    if (has_body || *method == Method::POST || *method == Method::PATCH) && !declared_json(headers) {
        return Err(Refusal::NotJson);
    }
    Ok(())
}

/// Check 4, for a GET of the feed or the placement: refuses what only a page of another site,
/// through an element or a link, makes a browser send.
///
/// # Errors
///
/// [`Refusal::CrossSite`].
pub(crate) fn check_heavy(hosts: &Hosts, headers: &HeaderMap) -> Result<(), Refusal> {
    let is = |name: &str, allowed: &[&[u8]]| {
        headers.get(name).is_none_or(|v| allowed.iter().any(|a| v.as_bytes().eq_ignore_ascii_case(a)))
    };
    let fetch_ok =
        is("sec-fetch-mode", &[b"cors", b"same-origin", b"navigate"]) && is("sec-fetch-dest", &[b"empty", b"document"]);
    let referer_ok = headers.get(header::REFERER).is_none_or(|r| {
        r.to_str()
            .ok()
            .and_then(|r| r.strip_prefix("http://").or_else(|| r.strip_prefix("https://")))
            .is_some_and(|rest| hosts.allows(rest.split(['/', '?', '#']).next().unwrap_or_default()))
    });
    if fetch_ok && referer_ok && !asks_for_an_element(headers) { Ok(()) } else { Err(Refusal::CrossSite) }
}

/// Whether `Accept` names a type only an element asks for: an image, audio, video, a font or a
/// style sheet (`<img>` sends `image/avif,image/webp,...,*/*;q=0.8`).
fn asks_for_an_element(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().flat_map(|v| v.as_bytes().split(|&b| b == b',')).any(|entry| {
        let media = entry.split(|&b| b == b';').next().unwrap_or_default().trim_ascii().to_ascii_lowercase();
        [&b"image/"[..], b"audio/", b"video/", b"font/"].iter().any(|p| media.starts_with(p)) || media == b"text/css"
    })
}

/// `Content-Type: application/json` (parameters such as `charset` allowed).
fn declared_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        let essence = v.as_bytes().split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        essence.eq_ignore_ascii_case(b"application/json")
    })
}

/// The token a request presents: `Authorization: Bearer TOKEN`, or, for a browser (which can
/// send no bearer token with a page or an `EventSource`), `Authorization: Basic` with the token as
/// the password and any user name (RFC 7617). The scheme in any case, spaces after it.
pub(crate) fn credential(headers: &HeaderMap) -> Option<Vec<u8>> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return Some(rest.trim_ascii().to_vec());
    }
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let pair = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, rest.trim_ascii()).ok()?;
    let colon = pair.iter().position(|&b| b == b':')?;
    Some(pair[colon + 1..].to_vec())
}

/// Whether `given` is `token`, in time independent of where they differ.
pub(crate) fn token_matches(given: Option<&[u8]>, token: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    given.is_some_and(|g| bool::from(g.ct_eq(token.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        h
    }

    fn loopback() -> Hosts {
        Hosts::new("127.0.0.1:9901".parse().expect("addr"), &["Admin.Internal".to_owned()])
    }

    #[test]
    fn hosts_the_api_answers_to() {
        let h = loopback();
        for ok in ["127.0.0.1:9901", "127.0.0.1", "localhost:9901", "LOCALHOST", "admin.internal:80", "[::1]:9901"] {
            assert_eq!(check(&h, &Method::GET, &head(&[("host", ok)])), Ok(()), "{ok}");
        }
        for bad in
            ["rebind.attacker.example:9901", "10.0.0.1:9901", "localhost.attacker.example", "", "admin.internal.evil"]
        {
            assert_eq!(check(&h, &Method::GET, &head(&[("host", bad)])), Err(Refusal::Host), "{bad}");
        }
        assert_eq!(check(&h, &Method::GET, &HeaderMap::new()), Ok(()), "no Host: not a browser");
        let two = head(&[("host", "localhost"), ("host", "evil.example")]);
        assert_eq!(check(&h, &Method::GET, &two), Err(Refusal::Host));
        let any = Hosts::new("0.0.0.0:9901".parse().expect("addr"), &[]);
        assert_eq!(check(&any, &Method::GET, &head(&[("host", "10.1.2.3:9901")])), Ok(()));
        assert_eq!(check(&any, &Method::GET, &head(&[("host", "pod.example:9901")])), Err(Refusal::Host));
    }

    #[test]
    fn cross_origin_and_non_json_bodies_are_refused() {
        let h = loopback();
        let json = ("content-type", "application/json; charset=utf-8");
        let post = |extra: &[(&str, &str)]| {
            let mut all = vec![("host", "127.0.0.1:9901"), ("content-length", "2")];
            all.extend_from_slice(extra);
            check(&h, &Method::POST, &head(&all))
        };
        assert_eq!(post(&[json]), Ok(()));
        assert_eq!(post(&[("content-type", "text/plain")]), Err(Refusal::NotJson));
        assert_eq!(post(&[]), Err(Refusal::NotJson));
        assert_eq!(post(&[json, ("origin", "http://evil.example")]), Err(Refusal::CrossOrigin));
        assert_eq!(post(&[json, ("origin", "null")]), Err(Refusal::CrossOrigin));
        assert_eq!(post(&[json, ("origin", "http://127.0.0.1:9901")]), Ok(()));
        assert_eq!(post(&[json, ("sec-fetch-site", "cross-site")]), Err(Refusal::CrossOrigin));
        assert_eq!(post(&[json, ("sec-fetch-site", "same-site")]), Err(Refusal::CrossOrigin));
        assert_eq!(post(&[json, ("sec-fetch-site", "same-origin")]), Ok(()));
        // DELETE has no body; a cross-site page still cannot send one.
        let del = head(&[("origin", "http://evil.example")]);
        assert_eq!(check(&h, &Method::DELETE, &del), Err(Refusal::CrossOrigin));
        assert_eq!(check(&h, &Method::DELETE, &HeaderMap::new()), Ok(()));
    }

    #[test]
    fn heavy_gets_asked_for_by_another_sites_page_are_refused() {
        let h = loopback();
        let img = "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8";
        for bad in [
            vec![("accept", img)],
            vec![("accept", "text/css,*/*;q=0.1")],
            vec![("accept", "*/*"), ("referer", "http://evil.example/")],
            vec![("referer", "https://admin.internal.evil/x")],
            vec![("referer", "about:client")],
            vec![("sec-fetch-mode", "no-cors")],
            vec![("sec-fetch-dest", "image")],
            vec![("sec-fetch-dest", "iframe"), ("sec-fetch-mode", "navigate")],
        ] {
            assert_eq!(check_heavy(&h, &head(&bad)), Err(Refusal::CrossSite), "{bad:?}");
        }
        for ok in [
            vec![],
            vec![("accept", "*/*")],
            vec![("accept", "text/event-stream"), ("sec-fetch-mode", "cors"), ("sec-fetch-dest", "empty")],
            vec![("referer", "http://admin.internal:9901/dashboard")],
            vec![("referer", "http://127.0.0.1:9901/dashboard?x=1")],
            vec![
                ("accept", "text/html,application/xhtml+xml"),
                ("sec-fetch-mode", "navigate"),
                ("sec-fetch-dest", "document"),
            ],
        ] {
            assert_eq!(check_heavy(&h, &head(&ok)), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn requests_through_a_gateway_are_refused() {
        let h = loopback();
        let via = head(&[("via", "1.0 fred, 1.1 keyroute-0123456789ab")]);
        assert_eq!(check(&h, &Method::GET, &via), Err(Refusal::Proxied));
        assert_eq!(check(&h, &Method::GET, &head(&[("via", "1.1 nginx")])), Ok(()));
    }

    #[test]
    fn basic_credentials_carry_the_token_as_their_password() {
        let t = "0123456789abcdef";
        // "operator:0123456789abcdef", ":0123456789abcdef", and a password holding a colon.
        for ok in ["Basic b3BlcmF0b3I6MDEyMzQ1Njc4OWFiY2RlZg==", "basic OjAxMjM0NTY3ODlhYmNkZWY="] {
            assert!(token_matches(credential(&head(&[("authorization", ok)])).as_deref(), t), "{ok}");
        }
        assert_eq!(credential(&head(&[("authorization", "Basic dTphOmI=")])).as_deref(), Some(&b"a:b"[..]));
        // No colon, bad base64, the token as the user name, padding inside.
        for bad in ["Basic MDEyMzQ1Njc4OWFiY2RlZg==", "Basic %%%%", "Basic MDEyMzQ1Njc4OWFiY2RlZjo=", "Basic YQ==YQ=="]
        {
            assert!(!token_matches(credential(&head(&[("authorization", bad)])).as_deref(), t), "{bad}");
        }
    }

    #[test]
    fn bearer_tokens() {
        let t = "0123456789abcdef";
        for ok in ["Bearer 0123456789abcdef", "bearer 0123456789abcdef", "BEARER   0123456789abcdef"] {
            assert!(token_matches(credential(&head(&[("authorization", ok)])).as_deref(), t), "{ok}");
        }
        for bad in ["Bearer 0123456789abcdeF", "Basic 0123456789abcdef", "Bearer", "Bearer0123456789abcdef"] {
            assert!(!token_matches(credential(&head(&[("authorization", bad)])).as_deref(), t), "{bad}");
        }
        assert!(!token_matches(None, t));
    }
}
