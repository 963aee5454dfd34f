//! TLS to workers (`[pool.upstream] tls = true`): rustls as a client, with the `ring` provider.
//!
//! A pool's workers are verified against a CA bundle (`ca_file`) or, without one, the system's
//! roots (the bundle `SSL_CERT_FILE` names, else the first of the usual distribution paths that
//! exists). The name checked is the pool's `server_name`: a fixed name, `{worker}` for each
//! worker's configured name, or, by default, the worker's IP address (which its certificate must
//! then list). `client_cert` and `client_key` are presented when the worker asks (mutual TLS);
//! `min_version` is 1.2 or 1.3. One client configuration serves a pool's every connection, so its
//! session cache lets a new connection resume a session rather than pay a full handshake.
//!
//! Everything is loaded when the configuration is validated: an unreadable bundle, a bundle with
//! no certificate, a client key that does not fit its certificate or a name that is not one is a
//! configuration error naming the field; a reload (`SIGHUP`) loads them again, and new
//! connections use what it loaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use crate::tls::{CertError, Certificate};

/// Where the system's CA bundle is looked for, in order, when `SSL_CERT_FILE` is not set:
/// Debian and Ubuntu, Fedora and RHEL, Alpine and macOS, openSUSE.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// The name a worker's certificate is checked against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NameRule {
    /// The worker's IP address.
    #[default]
    Address,
    /// The worker's configured name (`{worker}`).
    WorkerName,
    /// One name for every worker of the pool.
    Fixed(ServerName<'static>),
}

impl NameRule {
    /// `{worker}`, or a DNS name or IP address; `None` for anything else.
    pub fn parse(text: &str) -> Option<NameRule> {
        if text == "{worker}" {
            return Some(NameRule::WorkerName);
        }
        ServerName::try_from(text.to_owned()).ok().map(NameRule::Fixed)
    }
}

/// The oldest TLS version a connection to a worker may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

/// What `[pool.upstream]` says of TLS, before anything is loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsSettings {
    /// The CA bundle workers are verified against; the system's roots if `None`.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain and key, for workers that ask for one (mTLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The name checked.
    pub server_name: NameRule,
    /// The oldest version allowed.
    pub min_version: MinVersion,
}

/// A pool's TLS client, loaded: one rustls configuration (and so one session cache) per ALPN
/// offer the pool makes.
pub struct ClientTls {
    /// What it was loaded from.
    pub settings: ClientTlsSettings,
    config: Arc<ClientConfig>,
    /// The client certificate's validity, for the expiry gauge and warnings.
    pub client_cert: Option<Certificate>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The client certificate, offered whatever the worker's request for one says (a worker that
/// asks for one from another CA refuses the handshake itself, and says so).
#[derive(Debug)]
struct Presented(Arc<CertifiedKey>);

impl ResolvesClientCert for Presented {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ClientTls {
    /// Loads the CA bundle and the client certificate, offering `alpn` (most preferred first).
    ///
    /// # Errors
    ///
    /// A file that cannot be read, a bundle with no certificate in it, a client certificate or
    /// key that does not load or does not fit. [`CertError::field`] names the setting
    /// (`ca_file`, `client_cert`, `client_key`).
    pub fn load(settings: ClientTlsSettings, alpn: &[&[u8]]) -> Result<ClientTls, CertError> {
        let roots = roots(settings.ca_file.as_deref())?;
        let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version {
            MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            MinVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let builder = ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(versions)
            .map_err(|e| CertError { field: "min_version", message: e.to_string() })?
            .with_root_certificates(roots);
        let (mut config, client_cert) = match &settings.client_cert {
            None => (builder.with_no_client_auth(), None),
            Some((cert, key)) => {
                let loaded = Certificate::load(cert, key).map_err(|e| CertError {
                    field: if e.field == "cert" { "client_cert" } else { "client_key" },
                    message: e.message,
                })?;
                let resolver = Arc::new(Presented(loaded.certified_key()));
                (builder.with_client_cert_resolver(resolver), Some(loaded))
            }
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(ClientTls { settings, config: Arc::new(config), client_cert })
    }

    /// The rustls configuration every connection of the pool shares.
    pub(crate) fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// The name a worker's certificate is checked against.
    pub(crate) fn name_for(&self, worker_name: &str, addr: std::net::SocketAddr) -> Option<ServerName<'static>> {
        match &self.settings.server_name {
            NameRule::Address => Some(ServerName::IpAddress(addr.ip().into())),
            NameRule::WorkerName => ServerName::try_from(worker_name.to_owned()).ok(),
            NameRule::Fixed(n) => Some(n.clone()),
        }
    }
}

/// The trust anchors: the bundle's, or the system's.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, CertError> {
    let bad = |message: String| CertError { field: "ca_file", message };
    let path = match ca_file {
        Some(p) => p.to_owned(),
        None => system_bundle().ok_or_else(|| {
            bad("no ca_file, and no system CA bundle found (SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt...)"
                .into())
        })?,
    };
    let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    let mut store = rustls::RootCertStore::empty();
    let mut seen = 0;
    for der in CertificateDer::pem_slice_iter(&bytes) {
        let der = der.map_err(|e| bad(format!("{}: not a PEM certificate bundle ({e})", path.display())))?;
        seen += 1;
        // A bundle may hold certificates webpki cannot use as anchors; the rest still serve.
        let _ = store.add(der);
    }
    if store.is_empty() {
        return Err(bad(format!("{}: no usable CA certificate in it ({seen} read)", path.display())));
    }
    Ok(store)
}

/// The system's CA bundle: `SSL_CERT_FILE`, else the first usual path that exists.
fn system_bundle() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        return Some(PathBuf::from(p));
    }
    SYSTEM_BUNDLES.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Why a TLS handshake with a worker failed, in the words an operator looks for (expired, wrong
/// name, unknown CA...), from the error the handshake returned.
pub(crate) fn handshake_reason(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => reason(tls),
        None => e.to_string(),
    }
}

/// A TLS refusal somewhere in an exchange's error: under TLS 1.3 a worker that refuses the
/// client's certificate says so only after the client's side of the handshake is done, with an
/// alert that fails the first exchange. The request never reached the worker's application, so
/// it is a connect failure, not a response that failed.
pub(crate) fn refusal_in(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()?.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return refuses_certificates(tls).then(|| reason(tls));
        }
        cur = err.source();
    }
    None
}

/// Whether a TLS error is a refusal of a certificate (ours or the worker's), rather than a failure
/// of a connection that may already have carried the request.
fn refuses_certificates(tls: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match tls {
        rustls::Error::InvalidCertificate(_) => true,
        rustls::Error::AlertReceived(a) => matches!(
            a,
            A::CertificateRequired
                | A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::HandshakeFailure
        ),
        _ => false,
    }
}

fn reason(tls: &rustls::Error) -> String {
    use rustls::{CertificateError, Error};
    match tls {
        Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the worker's certificate has expired".to_owned()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the worker's certificate is not valid yet".to_owned()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "the worker's certificate is not valid for the name checked (server_name)".to_owned()
            }
            CertificateError::UnknownIssuer => "the worker's certificate is from an unknown CA".to_owned(),
            other => format!("the worker's certificate is refused: {other:?}"),
        },
        Error::AlertReceived(alert) => format!("the worker refused the handshake ({alert:?})"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused worker's log line says why in an operator's words, however deep the TLS error
    /// sits in the exchange's error chain.
    #[test]
    fn refusals_are_named() {
        use rustls::{AlertDescription, CertificateError, Error};
        let io = |e: Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        for (e, said) in [
            (Error::InvalidCertificate(CertificateError::Expired), "has expired"),
            (Error::InvalidCertificate(CertificateError::NotValidForName), "not valid for the name"),
            (Error::InvalidCertificate(CertificateError::UnknownIssuer), "unknown CA"),
            (Error::InvalidCertificate(CertificateError::NotValidYet), "not valid yet"),
            (Error::AlertReceived(AlertDescription::CertificateRequired), "refused the handshake"),
        ] {
            assert!(handshake_reason(&io(e.clone())).contains(said), "{e:?}");
            #[derive(Debug)]
            struct Outer(std::io::Error);
            impl std::fmt::Display for Outer {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("exchange failed")
                }
            }
            impl std::error::Error for Outer {
                fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                    Some(&self.0)
                }
            }
            let outer = Outer(io(e));
            assert!(refusal_in(&outer).is_some_and(|r| r.contains(said)), "in a chain: {said}");
        }
        assert_eq!(refusal_in(&std::io::Error::other("reset")), None, "not a TLS refusal");
        let internal = io(Error::AlertReceived(AlertDescription::InternalError));
        assert_eq!(refusal_in(&internal), None, "a failure that may follow the request is not a refusal");
    }
}
