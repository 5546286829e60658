//! The cluster's secrets as the operator reads them back: the cluster key (hex, in the key
//! Secret) and the cluster CA (`ca.crt` and `ca.key`, PEM). Both live only in Secrets.
//!
//! Apart from the reconcilers because both the cluster's steps and the controller
//! connection cache ([`crate::connections`]) read them, and the codec is tested alone.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use tandem_net::auth::ClusterKey;
use tandem_net::tls::ca::ClusterCa;

use crate::reconcile::{Error, kube};
use crate::{defaults, render};

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A Secret's value as text, from `data` (what an API server returns) or `stringData` (as
/// written, which the in-repo server keeps).
pub fn secret_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| s.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

/// Reads the cluster key from its Secret (the only place it lives).
pub async fn cluster_key(client: &Client, ns: &str, tc: &str) -> Result<Option<ClusterKey>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = render::key_secret_name(tc);
    let Some(s) = secrets
        .get_opt(&name)
        .await
        .map_err(kube("read key Secret"))?
    else {
        return Ok(None);
    };
    let bytes = secret_text(&s, defaults::KEY_FILE)
        .and_then(|t| unhex(&t))
        .ok_or(Error::BadKey(name))?;
    Ok(Some(ClusterKey::from_bytes(bytes)))
}

/// The cluster CA from its Secret (`ca.crt` and `ca.key`, both PEM).
pub fn ca_of(name: &str, s: &Secret) -> Result<ClusterCa, Error> {
    let cert = secret_text(s, defaults::CA_CERT_FILE);
    let key = secret_text(s, defaults::CA_KEY_FILE);
    match (cert, key) {
        (Some(c), Some(k)) => ClusterCa::from_pem(&c, &k).map_err(|_| Error::BadCa(name.into())),
        _ => Err(Error::BadCa(name.into())),
    }
}

pub async fn read_ca(client: &Client, ns: &str, tc: &str) -> Result<Option<ClusterCa>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let name = render::ca_secret_name(tc);
    secrets
        .get_opt(&name)
        .await
        .map_err(kube("read CA Secret"))?
        .map(|s| ca_of(&name, &s))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hex_round_trips() {
        let b = [7u8; 32];
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(unhex("zz"), None);
    }
}
