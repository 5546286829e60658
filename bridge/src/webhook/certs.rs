//! A private CA and the webhook's serving certificate, as `kube-webhook-certgen` makes them:
//! the API server trusts the CA through the webhook configuration's `caBundle`, and checks
//! the serving certificate against the Service's DNS name `SVC.NS.svc`. Pure: no I/O.
//!
//! Made by Tandem's one CA module (`tandem_net::tls::ca`): the CA is valid for 10 years and
//! the serving certificate for 2; the CA key is not kept (the Secret holds the serving pair
//! and `ca.crt` only). To rotate, delete the Secret and run `tandem-bridge webhook-certs`
//! again; the server reads the new files without a restart.

use tandem_net::tls::{TlsError, ca::ClusterCa};

/// PEM texts for a `kubernetes.io/tls` Secret plus its `ca.crt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// The names the API server may use for the Service `service` in `namespace`.
pub fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// A new CA, and a serving certificate for the Service signed by it: Tandem's one CA
/// module ([`ClusterCa`], ECDSA P-256), the same that issues the cluster's certificates.
pub fn generate(service: &str, namespace: &str) -> Result<Bundle, TlsError> {
    let ca = ClusterCa::generate()?;
    let (cert_pem, key_pem) = ca.issue(&dns_names(service, namespace))?;
    Ok(Bundle {
        ca_pem: ca.cert_pem().to_owned(),
        cert_pem,
        key_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use std::sync::Arc;

    /// Verifies `cert` for `host` the way the API server's TLS client does.
    fn verify(ca_pem: &str, cert_pem: &str, host: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let v = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        use rustls::client::danger::ServerCertVerifier as _;
        v.verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from(host.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
    }

    #[test]
    fn the_serving_certificate_chains_to_the_ca_for_the_service_names() {
        let b = generate("tandem-bridge-webhook", "tandem").unwrap();
        for host in dns_names("tandem-bridge-webhook", "tandem") {
            verify(&b.ca_pem, &b.cert_pem, &host).unwrap();
        }
        assert!(verify(&b.ca_pem, &b.cert_pem, "other.tandem.svc").is_err());
        // Another run's CA does not vouch for this certificate.
        let other = generate("tandem-bridge-webhook", "tandem").unwrap();
        assert!(
            verify(
                &other.ca_pem,
                &b.cert_pem,
                "tandem-bridge-webhook.tandem.svc"
            )
            .is_err()
        );
        // The key is the certificate's.
        let provider = rustls::crypto::ring::default_provider();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(b.key_pem.as_bytes()).unwrap();
        let leaf = CertificateDer::from_pem_slice(b.cert_pem.as_bytes()).unwrap();
        rustls::sign::CertifiedKey::from_der(vec![leaf], key, &provider).unwrap();
    }
}
