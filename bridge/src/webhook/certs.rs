//! A private CA and the webhook's serving certificate, as `kube-webhook-certgen` makes them:
//! the API server trusts the CA through the webhook configuration's `caBundle`, and checks
//! the serving certificate against the Service's DNS name `SVC.NS.svc`. Pure: no I/O.
//!
//! Both stay valid for rcgen's default span (to the year 4096): the CA never leaves the
//! cluster and the key lives only in the Secret. To rotate, delete the Secret and run
//! `tandem-bridge webhook-certs` again; the server reads the new files without a restart.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

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

/// A new CA, and a serving certificate for the Service signed by it.
pub fn generate(service: &str, namespace: &str) -> Result<Bundle, rcgen::Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name = name("tandem-bridge webhook CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

    let mut leaf = CertificateParams::new(dns_names(service, namespace))?;
    leaf.distinguished_name = name(&format!("{service}.{namespace}.svc"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;
    Ok(Bundle {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
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
