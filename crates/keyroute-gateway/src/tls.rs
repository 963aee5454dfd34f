//! TLS termination with rustls (the `ring` provider: builds with Rust and a C compiler only).
//!
//! A TLS listener has one or more certificates (PEM chain and key each). The client's SNI name
//! picks the first certificate valid for it (exact names and wildcards, as a client would check
//! them); without SNI, or with a name no certificate has, the first one serves. ALPN offers `h2`
//! (when HTTP/2 is on) and `http/1.1`; TLS 1.2 and 1.3.
//!
//! Certificates are loaded when the configuration is validated, so a missing file, a key that
//! does not match its certificate or a file that is not PEM is a configuration error naming the
//! field. A reload swaps a listener's certificates in place ([`Certificates::replace`]): new
//! handshakes get the new ones, established connections are untouched, and a reload whose
//! certificates do not load changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        let key_bytes = std::fs::read(key).map_err(|e| bad("key", format!("cannot read {}: {e}", key.display())))?;
        let private = PrivateKeyDer::from_pem_slice(&key_bytes)
            .map_err(|e| bad("key", format!("{}: not a PEM private key ({e})", key.display())))?;
        let loaded = CertifiedKey::from_der(chain, private, &provider())
            .map_err(|e| bad("key", format!("{}: does not fit {} ({e})", key.display(), cert.display())))?;
        Ok(Certificate { cert: cert.to_owned(), key: key.to_owned(), loaded: Arc::new(loaded) })
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

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let certs = self.current.load();
        let by_name = hello
            .server_name()
            .and_then(|n| ServerName::try_from(n).ok())
            .and_then(|name| certs.iter().find(|c| c.valid_for(&name)));
        by_name.or_else(|| certs.first()).map(|c| Arc::clone(&c.loaded))
    }
}

/// The rustls configuration of a TLS listener, and its certificates (for reloads).
///
/// # Errors
///
/// None in practice: the provider supports the default protocol versions.
pub(crate) fn server_config(
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
