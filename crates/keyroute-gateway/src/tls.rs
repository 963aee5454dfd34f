//! TLS termination with rustls (the `ring` provider: builds with Rust and a C compiler only).
//!
//! A TLS listener has one or more certificates (PEM chain and key each). The client's SNI name
//! picks the first certificate valid for it (exact names and wildcards, as a client would check
//! them) and valid now (within its `notBefore`..`notAfter`); only when every certificate for the
//! name has expired (or is not valid yet) does the first of those serve. Without SNI, or with a
//! name no certificate has, the first certificate valid now serves (the first one if none is).
//! `serve --check` and start-up warn about a certificate that has expired or expires within 14
//! days, and `keyroute_listener_certificate_expiry_seconds` counts down to each one's end. ALPN offers `h2`
//! (when HTTP/2 is on) and `http/1.1`; TLS 1.2 and 1.3.
//!
//! Certificates are loaded when the configuration is validated, so a missing file, a key that
//! does not match its certificate or a file that is not PEM is a configuration error naming the
//! field. A reload swaps a listener's certificates in place ([`Certificates::replace`]): new
//! handshakes get the new ones, established connections are untouched, and a reload whose
//! certificates do not load changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// One certificate as configured: the files, and what was loaded from them.
#[derive(Clone)]
pub struct Certificate {
    /// The PEM certificate chain (end entity first).
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
    /// The end-entity certificate's validity: `notBefore` and `notAfter`.
    pub valid: (SystemTime, SystemTime),
    loaded: Arc<CertifiedKey>,
}

impl std::fmt::Debug for Certificate {
    /// The files only: the loaded key never goes into a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

impl PartialEq for Certificate {
    fn eq(&self, other: &Self) -> bool {
        self.cert == other.cert && self.key == other.key
    }
}

impl Eq for Certificate {}

/// Why a certificate did not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertError {
    /// `cert` or `key`.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Certificate {
    /// Loads a certificate chain and its key.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds no PEM certificate or key, or a key that does not
    /// match the certificate.
    pub fn load(cert: &Path, key: &Path) -> Result<Certificate, CertError> {
        let bad = |field, message: String| CertError { field, message };
        let bytes = std::fs::read(cert).map_err(|e| bad("cert", format!("cannot read {}: {e}", cert.display())))?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<_, _>>()
            .map_err(|e| bad("cert", format!("{}: not a PEM certificate chain ({e})", cert.display())))?;
        if chain.is_empty() {
            return Err(bad("cert", format!("{}: no certificate in it", cert.display())));
        }
        if webpki::EndEntityCert::try_from(&chain[0]).is_err() {
            return Err(bad("cert", format!("{}: the first certificate cannot be parsed", cert.display())));
        }
        let valid = validity(&chain[0]).ok_or_else(|| {
            bad("cert", format!("{}: the first certificate's validity cannot be read", cert.display()))
        })?;
        let key_bytes = std::fs::read(key).map_err(|e| bad("key", format!("cannot read {}: {e}", key.display())))?;
        let private = PrivateKeyDer::from_pem_slice(&key_bytes)
            .map_err(|e| bad("key", format!("{}: not a PEM private key ({e})", key.display())))?;
        let loaded = CertifiedKey::from_der(chain, private, &provider())
            .map_err(|e| bad("key", format!("{}: does not fit {} ({e})", key.display(), cert.display())))?;
        Ok(Certificate { cert: cert.to_owned(), key: key.to_owned(), valid, loaded: Arc::new(loaded) })
    }

    /// The chain and key, loaded.
    pub(crate) fn certified_key(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.loaded)
    }

    /// Whether `now` is within the certificate's validity.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.valid.0 <= now && now <= self.valid.1
    }

    /// What to warn about at `now`: an expired certificate, one not valid yet, or one that
    /// expires within [`EXPIRY_WARNING`].
    pub fn warning(&self, now: SystemTime) -> Option<String> {
        if now > self.valid.1 {
            return Some(format!("{} has expired", self.cert.display()));
        }
        if now < self.valid.0 {
            return Some(format!("{} is not valid yet", self.cert.display()));
        }
        let left = self.valid.1.duration_since(now).ok().filter(|l| *l < EXPIRY_WARNING)?;
        Some(format!("{} expires in {:.1} days", self.cert.display(), left.as_secs_f64() / 86_400.0))
    }

    fn valid_for(&self, name: &ServerName<'_>) -> bool {
        self.loaded
            .end_entity_cert()
            .ok()
            .and_then(|der| webpki::EndEntityCert::try_from(der).ok())
            .is_some_and(|ee| ee.verify_is_valid_for_subject_name(name).is_ok())
    }
}

/// A listener's certificates, swapped whole by a reload; the SNI resolver of its TLS config.
pub struct Certificates {
    current: ArcSwap<Vec<Certificate>>,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.current.load().iter()).finish()
    }
}

impl Certificates {
    /// Replaces the certificates for new handshakes.
    pub fn replace(&self, certs: Vec<Certificate>) {
        self.current.store(Arc::new(certs));
    }
}

impl Certificates {
    /// The certificate for a client's SNI name at `now` (see the [module documentation](self)).
    fn choose(&self, name: Option<&str>, now: SystemTime) -> Option<Arc<CertifiedKey>> {
        let certs = self.current.load();
        let name = name.and_then(|n| ServerName::try_from(n).ok());
        let for_name = |c: &&Certificate| name.as_ref().is_some_and(|n| c.valid_for(n));
        let by_name = certs.iter().filter(for_name).find(|c| c.valid_at(now)).or_else(|| certs.iter().find(for_name));
        by_name
            .or_else(|| certs.iter().find(|c| c.valid_at(now)))
            .or_else(|| certs.first())
            .map(|c| Arc::clone(&c.loaded))
    }

    /// Each certificate's file and the seconds until it expires at `now` (negative once it has).
    pub fn expiry(&self, now: SystemTime) -> Vec<(PathBuf, i64)> {
        self.current
            .load()
            .iter()
            .map(|c| {
                let secs = match c.valid.1.duration_since(now) {
                    Ok(left) => left.as_secs() as i64,
                    Err(past) => -(past.duration().as_secs() as i64),
                };
                (c.cert.clone(), secs)
            })
            .collect()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.choose(hello.server_name(), SystemTime::now())
    }
}

/// How long before a certificate's end `serve --check` and start-up warn about it.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86_400);

/// The `notBefore` and `notAfter` of an X.509 certificate (RFC 5280 §4.1: `Certificate` is a
/// SEQUENCE whose first element, `tbsCertificate`, holds an optional `[0]` version, the serial
/// number, the signature algorithm, the issuer and then `validity`), read from its DER.
fn validity(der: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (tag, cert, _) = der_item(der)?;
    let (tbs_tag, tbs, _) = der_item(cert).filter(|_| tag == 0x30)?;
    if tbs_tag != 0x30 {
        return None;
    }
    let mut rest = tbs;
    let (first, _, after) = der_item(rest)?;
    if first == 0xa0 {
        rest = after;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        rest = der_item(rest)?.2;
    }
    let (vtag, validity, _) = der_item(rest)?;
    if vtag != 0x30 {
        return None;
    }
    let (t1, not_before, more) = der_item(validity)?;
    let (t2, not_after, _) = der_item(more)?;
    Some((der_time(t1, not_before)?, der_time(t2, not_after)?))
}

/// One DER item: its tag, its contents and what follows it.
fn der_item(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn der_time(tag: u8, text: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(text).ok().filter(|t| t.is_ascii())?.strip_suffix('Z')?;
    let digits = |s: &str| s.parse::<u32>().ok().filter(|_| s.bytes().all(|b| b.is_ascii_digit()));
    let (year, rest) = match (tag, text.len()) {
        (0x17, 12) => {
            let yy = digits(&text[..2])? as i32;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        (0x18, 14) => (digits(&text[..4])? as i32, &text[4..]),
        _ => return None,
    };
    let month = time::Month::try_from(u8::try_from(digits(&rest[..2])?).ok()?).ok()?;
    let date = time::Date::from_calendar_date(year, month, u8::try_from(digits(&rest[2..4])?).ok()?).ok()?;
    let at = |i: usize| u8::try_from(digits(&rest[i..i + 2])?).ok();
    let time = time::Time::from_hms(at(4)?, at(6)?, at(8)?).ok()?;
    let unix = time::PrimitiveDateTime::new(date, time).assume_utc().unix_timestamp();
    let secs = u64::try_from(unix).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The rustls configuration of a TLS listener, and its certificates (for reloads).
///
/// # Errors
///
/// None in practice: the provider supports the default protocol versions.
pub fn server_config(
    certs: Vec<Certificate>,
    http2: bool,
) -> Result<(Arc<ServerConfig>, Arc<Certificates>), rustls::Error> {
    let resolver = Arc::new(Certificates { current: ArcSwap::from_pointee(certs) });
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok((Arc::new(config), resolver))
}
