//! TLS for every gRPC connection: loading certificates, building rustls configurations, and
//! the rules that decide whether a daemon or client speaks TLS or plain text.
//!
//! # What it protects
//!
//! The HMAC credentials ([`crate::auth`]) prove who sent a request; TLS keeps the request,
//! the reply (job scripts, environment, output) and the credential itself from being read or
//! replayed by anyone on the network path, and lets a client check that the server holds a
//! certificate issued by the cluster's CA before it sends anything.
//!
//! # Shapes
//!
//! - A server needs a certificate chain and its key: `--tls-cert FILE --tls-key FILE`, or
//!   `--tls-dir DIR` holding `tls.crt`, `tls.key` (and `ca.crt`), the layout of a Kubernetes
//!   `kubernetes.io/tls` Secret as cert-manager writes it.
//! - A client needs the cluster CA (`ca.crt`): the cluster file's `ca_file`,
//!   `$TANDEM_CA_FILE`, or a daemon's `--tls-ca` / `--tls-dir`. No OS trust store is read:
//!   only the cluster CA can vouch for a Tandem server, and a fresh CLI process does not pay
//!   for scanning hundreds of system roots.
//! - Plain text only with `--insecure-plaintext`, refused unless every address involved is a
//!   loopback one ([`Options::server`], [`Options::client`]).
//!
//! Keys are ECDSA P-256 ([`ca`]): a handshake costs one signature and one verification,
//! well under a millisecond on loopback.

pub mod ca;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// File names inside a `--tls-dir` (those of a `kubernetes.io/tls` Secret with its CA).
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const CA_FILE: &str = "ca.crt";

/// How a listener's connections are secured.
#[derive(Debug, Clone)]
pub enum ServerSecurity {
    /// TLS with this certificate (see [`server_config`]).
    Tls(Arc<rustls::ServerConfig>),
    /// Plain text: only with `--insecure-plaintext`, on loopback ([`Options`]).
    Plaintext,
}

/// How a client's connections are secured.
#[derive(Debug, Clone)]
pub enum ClientSecurity {
    /// TLS, verifying the server against the cluster CA ([`client_config`]).
    Tls(Arc<rustls::ClientConfig>),
    Plaintext,
}

impl ClientSecurity {
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientSecurity::Tls(_))
    }
}

/// gRPC runs over HTTP/2; both ends announce it (gRPC clients in other languages insist).
const ALPN_H2: &[u8] = b"h2";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {path}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("cannot read {what} from PEM text")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("invalid TLS material: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Flags(String),
    #[error("the certificate in {path} is not valid for {name:?}: {why}")]
    WrongName {
        path: PathBuf,
        name: String,
        why: String,
    },
}

/// The one crypto provider (ring: builds anywhere, no cmake or C toolchain beyond cc).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        what: "certificates",
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what: "certificate",
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Every certificate in PEM text (a CA kept in a Kubernetes Secret, read through the API).
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Pem {
        what: "certificates",
        source,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(read(rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, SEC1 or PKCS#1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "private key",
            path: path.to_owned(),
        },
        source => TlsError::Read {
            what: "a private key",
            path: path.to_owned(),
            source,
        },
    })
}

/// A server configuration presenting `cert` (a PEM chain) with `key`. Clients are not asked
/// for certificates: who they are is the credential's job ([`crate::auth`]).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = load_certs(cert)?;
    let key = load_key(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// Checks that the first certificate in `cert` (a PEM chain, leaf first) names `name` (a DNS
/// name or an IP address) as a client verifying `name` would: a worker checks at start that
/// its step certificate names its node, which srun verifies, rather than srun failing later.
pub fn check_certificate_name(cert: &Path, name: &str) -> Result<(), TlsError> {
    let wrong = |why: String| TlsError::WrongName {
        path: cert.to_owned(),
        name: name.to_owned(),
        why,
    };
    let server_name = rustls::pki_types::ServerName::try_from(name)
        .map_err(|e| wrong(format!("not a DNS name or IP address ({e})")))?;
    let leaf = load_certs(cert)?.swap_remove(0);
    let parsed = rustls::server::ParsedCertificate::try_from(&leaf)?;
    rustls::client::verify_server_name(&parsed, &server_name).map_err(|e| wrong(e.to_string()))
}

/// A client configuration that trusts exactly the CA certificates in `ca` (PEM).
pub fn client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    client_config_from(load_certs(ca)?)
}

/// [`client_config`] from CA certificates in PEM text.
pub fn client_config_pem(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    client_config_from(certs_from_pem(ca_pem)?)
}

/// [`client_config`] from certificates already parsed.
pub fn client_config_from(
    cas: Vec<CertificateDer<'static>>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The TLS flags a daemon takes, as typed; [`Options::server`] and [`Options::client`]
/// check them and load the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub ca: Option<PathBuf>,
    pub dir: Option<PathBuf>,
    pub insecure_plaintext: bool,
}

impl Options {
    fn any_tls(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.ca.is_some() || self.dir.is_some()
    }

    fn check_exclusive(&self) -> Result<(), TlsError> {
        if self.insecure_plaintext && self.any_tls() {
            return Err(TlsError::Flags(
                "--insecure-plaintext cannot be combined with --tls-cert, --tls-key, --tls-ca or --tls-dir".into(),
            ));
        }
        if self.dir.is_some() && (self.cert.is_some() || self.key.is_some()) {
            return Err(TlsError::Flags(
                "give either --tls-dir or --tls-cert/--tls-key, not both".into(),
            ));
        }
        Ok(())
    }

    /// How a server listening on `listen` speaks: TLS with the certificate and key given,
    /// or plain text when `--insecure-plaintext` was given and every address is loopback.
    pub fn server(&self, listen: &[SocketAddr]) -> Result<ServerSecurity, TlsError> {
        self.server_named(listen, None)
    }

    /// As [`Options::server`]; with TLS the certificate must also name `name` if given
    /// ([`check_certificate_name`]): a worker's step service and its node name.
    pub fn server_named(
        &self,
        listen: &[SocketAddr],
        name: Option<&str>,
    ) -> Result<ServerSecurity, TlsError> {
        self.check_exclusive()?;
        if self.insecure_plaintext {
            if let Some(a) = listen.iter().find(|a| !a.ip().is_loopback()) {
                return Err(TlsError::Flags(format!(
                    "--insecure-plaintext is refused on {a}: plain text is allowed only on a loopback address (127.0.0.1, ::1); give --tls-cert and --tls-key or --tls-dir"
                )));
            }
            return Ok(ServerSecurity::Plaintext);
        }
        let (cert, key) = match (&self.dir, &self.cert, &self.key) {
            (Some(d), _, _) => (d.join(CERT_FILE), d.join(KEY_FILE)),
            (None, Some(c), Some(k)) => (c.clone(), k.clone()),
            (None, Some(_), None) => {
                return Err(TlsError::Flags("--tls-cert needs --tls-key".into()));
            }
            (None, None, Some(_)) => {
                return Err(TlsError::Flags("--tls-key needs --tls-cert".into()));
            }
            (None, None, None) => {
                return Err(TlsError::Flags(
                    "no TLS certificate: give --tls-cert and --tls-key (or --tls-dir DIR with tls.crt and tls.key); plain text needs --insecure-plaintext and a loopback address".into(),
                ));
            }
        };
        let config = server_config(&cert, &key)?;
        if let Some(name) = name {
            check_certificate_name(&cert, name)?;
        }
        Ok(ServerSecurity::Tls(config))
    }

    /// How this daemon connects to `peer` (`http[s]://HOST:PORT`): verifying the server
    /// against `--tls-ca` (or `DIR/ca.crt`, or `fallback_ca`, the cluster file's), or plain
    /// text with `--insecure-plaintext` when `peer` is a loopback address.
    pub fn client(
        &self,
        peer: &str,
        fallback_ca: Option<&Path>,
    ) -> Result<ClientSecurity, TlsError> {
        self.check_exclusive()?;
        if self.insecure_plaintext {
            if !is_loopback_address(peer) {
                return Err(TlsError::Flags(format!(
                    "--insecure-plaintext is refused for {peer}: plain text is allowed only to a loopback address; give --tls-ca or --tls-dir"
                )));
            }
            return Ok(ClientSecurity::Plaintext);
        }
        let ca = match (&self.ca, &self.dir, fallback_ca) {
            (Some(ca), _, _) => ca.clone(),
            (None, Some(d), _) => d.join(CA_FILE),
            (None, None, Some(ca)) => ca.to_owned(),
            (None, None, None) => {
                return Err(TlsError::Flags(format!(
                    "no CA to verify {peer} against: give --tls-ca FILE (or --tls-dir DIR with ca.crt); plain text needs --insecure-plaintext and a loopback address"
                )));
            }
        };
        Ok(ClientSecurity::Tls(client_config(&ca)?))
    }
}

/// Whether `address` (`[scheme://]HOST:PORT`) names this machine: a loopback IP or
/// `localhost`.
pub fn is_loopback_address(address: &str) -> bool {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => rest.rsplit_once(':').map_or(rest, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        for a in [
            "http://127.0.0.1:1",
            "127.0.0.5:9",
            "https://localhost:3",
            "http://[::1]:4",
            "[::1]:4",
        ] {
            assert!(is_loopback_address(a), "{a}");
        }
        for a in [
            "http://10.0.0.1:1",
            "node-1:7",
            "https://[::2]:1",
            "example.com:1",
        ] {
            assert!(!is_loopback_address(a), "{a}");
        }
    }

    #[test]
    fn plain_text_needs_the_flag_and_loopback() {
        let none = Options::default();
        let err = none.server(&["127.0.0.1:1".parse().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("--insecure-plaintext"), "{err}");
        let err = none.client("http://127.0.0.1:1", None).unwrap_err();
        assert!(err.to_string().contains("--tls-ca"), "{err}");

        let plain = Options {
            insecure_plaintext: true,
            ..Options::default()
        };
        assert!(matches!(
            plain.server(&["127.0.0.1:1".parse().unwrap()]),
            Ok(ServerSecurity::Plaintext)
        ));
        let err = plain.server(&["0.0.0.0:1".parse().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("0.0.0.0:1"), "{err}");
        assert!(matches!(
            plain.client("http://localhost:1", None),
            Ok(ClientSecurity::Plaintext)
        ));
        assert!(plain.client("http://10.1.2.3:1", None).is_err());

        let both = Options {
            insecure_plaintext: true,
            ca: Some("/ca.crt".into()),
            ..Options::default()
        };
        assert!(both.client("http://127.0.0.1:1", None).is_err());
    }

    #[test]
    fn a_server_certificate_is_checked_against_the_name_it_must_carry() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
        let srv = dir.path().join("srv");
        ca.write_server_dir(&srv, &["10.1.2.3".into(), "kn-1".into()])
            .unwrap();
        let cert = srv.join(CERT_FILE);
        for ok in ["kn-1", "10.1.2.3"] {
            check_certificate_name(&cert, ok).unwrap();
        }
        for (wrong, says) in [
            ("kn-2", "not valid for \"kn-2\""),
            ("10.1.2.4", "10.1.2.4"),
            ("a b", "not a DNS name"),
        ] {
            let err = check_certificate_name(&cert, wrong)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says) && err.contains("tls.crt"),
                "{wrong}: {err}"
            );
        }
        let opts = Options {
            dir: Some(srv.clone()),
            ..Options::default()
        };
        let listen = ["127.0.0.1:1".parse().unwrap()];
        assert!(opts.server_named(&listen, Some("kn-1")).is_ok());
        assert!(opts.server_named(&listen, Some("kn-2")).is_err());
        // Plain text has no certificate to check.
        let plain = Options {
            insecure_plaintext: true,
            ..Options::default()
        };
        assert!(plain.server_named(&listen, Some("kn-2")).is_ok());
    }

    #[test]
    fn missing_or_empty_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = client_config(&empty).unwrap_err().to_string();
        assert!(
            err.contains("empty.pem") && err.contains("no certificate"),
            "{err}"
        );
        let err = client_config(&dir.path().join("absent.pem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("absent.pem"), "{err}");
        let err = Options {
            dir: Some(dir.path().to_owned()),
            ..Options::default()
        }
        .server(&["127.0.0.1:1".parse().unwrap()])
        .unwrap_err()
        .to_string();
        assert!(err.contains("tls.crt"), "{err}");
    }
}
