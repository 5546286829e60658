//! A cluster CA made on the spot (rcgen, ECDSA P-256), and the server certificates it
//! issues: what `tandem up` uses so that an all-in-one cluster speaks TLS with no setup.
//!
//! ```text
//! DIR/ca/ca.crt            the CA certificate (0644: every client needs it)
//! DIR/ca/ca.key            its key (0600: only the cluster owner issues certificates)
//! DIR/NAME/tls.crt         a server certificate for NAME's addresses (0644)
//! DIR/NAME/tls.key         its key (0600)
//! DIR/NAME/ca.crt          a copy of the CA certificate, so DIR/NAME is a `--tls-dir`
//! ```
//!
//! On Kubernetes the operator keeps the CA in a Secret instead ([`ClusterCa::generate`],
//! [`ClusterCa::from_pem`]) and issues the certificates into `kubernetes.io/tls` Secrets
//! (`tls.crt`, `tls.key`, `ca.crt`): the controller's, and one per worker pod for its node
//! name, which is what srun verifies a step service by ([`crate::net::connect_verifying`]),
//! so no worker holds the CA key. `tandem worker --tls-issue-from DIR` still issues a step
//! certificate at start from a CA directory ([`ClusterCa::load`]), for machines that have
//! one.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use super::{CA_FILE, CERT_FILE, KEY_FILE, TlsError};

const CA_KEY_FILE: &str = "ca.key";
const CA_COMMON_NAME: &str = "Tandem cluster CA";
/// Years a CA is valid; server certificates are re-issued at every `tandem up`.
const CA_YEARS: i32 = 10;
const SERVER_YEARS: i32 = 2;

/// A CA that can issue server certificates.
pub struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// Kept to store the CA elsewhere (the operator's Secret); never logged.
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

/// The calendar year now (approximate to a day: only used to set validity on whole years,
/// with a year of slack before).
fn this_year() -> i32 {
    let days = crate::clock::unix_now() / 86_400;
    1970 + i32::try_from(days * 10_000 / 3_652_425).unwrap_or(0)
}

/// The CA's identity, the same every time: an issuer rebuilt from the stored key signs
/// certificates that chain to the stored CA certificate.
fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_COMMON_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

impl ClusterCa {
    /// The CA certificate's path under `dir`.
    pub fn cert_path(dir: &Path) -> PathBuf {
        dir.join(CA_FILE)
    }

    /// Loads the CA in `dir`, or makes one (ECDSA P-256) if there is none.
    pub fn load_or_create(dir: &Path) -> Result<ClusterCa, TlsError> {
        let (cert_path, key_path) = (dir.join(CA_FILE), dir.join(CA_KEY_FILE));
        if cert_path.exists() && key_path.exists() {
            return Self::load(dir);
        }
        create_dir(dir)?;
        let ca = Self::generate()?;
        write_file(&key_path, ca.key_pem.as_bytes(), 0o600)?;
        write_file(&cert_path, ca.cert_pem.as_bytes(), 0o644)?;
        Ok(ca)
    }

    /// Loads the CA in `dir` (`ca.crt`, `ca.key`), as a mounted Secret holds it.
    pub fn load(dir: &Path) -> Result<ClusterCa, TlsError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| TlsError::ReadFile {
                path: path.to_owned(),
                source,
            })
        };
        Self::from_pem(&read(&dir.join(CA_FILE))?, &read(&dir.join(CA_KEY_FILE))?)
    }

    /// A CA from its certificate and key (PEM), as [`ClusterCa::cert_pem`] and
    /// [`ClusterCa::key_pem`] gave them.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, TlsError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(ClusterCa {
            issuer: Issuer::new(ca_params(), key),
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        })
    }

    /// A new CA (ECDSA P-256) in memory; the caller stores it.
    pub fn generate() -> Result<ClusterCa, TlsError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = ca_params();
        let year = this_year();
        params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
        params.not_after = rcgen::date_time_ymd(year + CA_YEARS, 1, 1);
        let cert_pem = params.self_signed(&key)?.pem();
        let key_pem = key.serialize_pem();
        Ok(ClusterCa {
            issuer: Issuer::new(ca_params(), key),
            cert_pem,
            key_pem,
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PEM): whoever holds it can issue certificates for any name.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A server certificate and key (PEM) valid for `names` (IP addresses or DNS names).
    pub fn issue(&self, names: &[String]) -> Result<(String, String), TlsError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().map_or("tandem", String::as_str),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let year = this_year();
        params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
        params.not_after = rcgen::date_time_ymd(year + SERVER_YEARS, 1, 1);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a certificate for `names` into `dir` as a `--tls-dir` (`tls.crt`, `tls.key`,
    /// `ca.crt`), replacing what was there.
    pub fn write_server_dir(&self, dir: &Path, names: &[String]) -> Result<(), TlsError> {
        let (cert, key) = self.issue(names)?;
        create_dir(dir)?;
        write_file(&dir.join(KEY_FILE), key.as_bytes(), 0o600)?;
        write_file(&dir.join(CERT_FILE), cert.as_bytes(), 0o644)?;
        write_file(&dir.join(CA_FILE), self.cert_pem.as_bytes(), 0o644)
    }
}

fn create_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })
}

/// Writes `bytes` to a temp file created with `mode` (never wider, not even for a moment),
/// then renames it over `path`, so a reader sees the old file or the new one.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_reloaded_ca_issues_certificates_that_chain_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let first = ClusterCa::load_or_create(&ca_dir).unwrap();
        let again = ClusterCa::load_or_create(&ca_dir).unwrap();
        assert_eq!(first.cert_pem(), again.cert_pem(), "the CA was re-made");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);
        assert_eq!(mode(&ca_dir.join("ca.crt")), 0o644);

        let server = dir.path().join("controller");
        again
            .write_server_dir(&server, &["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        assert_eq!(mode(&server.join("tls.key")), 0o600);
        // The chain verifies against the CA as the first one wrote it.
        let roots = super::super::load_certs(&ClusterCa::cert_path(&ca_dir)).unwrap();
        let leaf = super::super::load_certs(&server.join("tls.crt")).unwrap();
        let mut store = rustls::RootCertStore::empty();
        store.add(roots[0].clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(store),
            super::super::provider(),
        )
        .build()
        .unwrap();
        use rustls::client::danger::ServerCertVerifier as _;
        let now = rustls::pki_types::UnixTime::now();
        let ip = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        verifier
            .verify_server_cert(&leaf[0], &[], &ip, &[], now)
            .unwrap();
        let other = rustls::pki_types::ServerName::try_from("node-9").unwrap();
        assert!(
            verifier
                .verify_server_cert(&leaf[0], &[], &other, &[], now)
                .is_err(),
            "a name not in the SANs was accepted"
        );
    }

    #[test]
    fn a_ca_kept_as_pem_issues_certificates_that_chain_to_it() {
        let ca = ClusterCa::generate().unwrap();
        let again = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let (leaf, _) = again
            .issue(&["10.96.0.10".into(), "svc.ns.svc".into()])
            .unwrap();
        let config =
            crate::tls::client_config_pem(ca.cert_pem().as_bytes()).expect("a CA certificate");
        assert!(!config.alpn_protocols.is_empty());
        use rustls::pki_types::pem::PemObject as _;
        let leaf = rustls::pki_types::CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap();
        let mut store = rustls::RootCertStore::empty();
        for c in crate::tls::certs_from_pem(ca.cert_pem().as_bytes()).unwrap() {
            store.add(c).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(store),
            super::super::provider(),
        )
        .build()
        .unwrap();
        use rustls::client::danger::ServerCertVerifier as _;
        let now = rustls::pki_types::UnixTime::now();
        for name in ["10.96.0.10", "svc.ns.svc"] {
            let n = rustls::pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&leaf, &[], &n, &[], now)
                .unwrap();
        }
        assert!(ClusterCa::from_pem(ca.cert_pem(), "not a key").is_err());
    }
}
