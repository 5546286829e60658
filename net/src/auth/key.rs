//! The cluster key: the 32-byte secret every daemon of one cluster shares, its key file
//! (written 0600, refused when group or others may read it), and signing and verifying the
//! credentials of [`super::credential`] with it.
//!
//! It is apart from [`super::credential`] (the format, which knows nothing of keys or files)
//! and from the interceptors ([`super::server`], [`super::client`]), which only call
//! [`ClusterKey::issue`] and [`ClusterKey::verify_at`].

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::metadata::MetadataMap;

use super::credential;
use super::{
    AUTH_HEADER, Credential, DEFAULT_LIFETIME, Identity, MAX_LIFETIME, StepGrant, TokenError,
    unix_now,
};

type HmacSha256 = Hmac<Sha256>;

/// Length of the cluster key in bytes.
pub const KEY_LEN: usize = 32;

/// Metadata key that carries the token.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot generate a cluster key: {0}")]
    Random(String),
    #[error("cannot write cluster key {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read cluster key {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cluster key {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("cluster key {path} is malformed: expected {expected} hex digits")]
    Malformed { path: PathBuf, expected: usize },
}

/// The shared secret of one cluster.
#[derive(Clone)]
pub struct ClusterKey {
    bytes: [u8; KEY_LEN],
}

// Never print key material, not even in debug logs.
impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self { bytes })
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self { bytes }
    }

    /// Writes the key hex-encoded to a new file with mode 0600. Fails if the file exists, so
    /// an existing cluster's key is never overwritten by accident.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyError> {
        let err = |source| KeyError::Write {
            path: path.to_owned(),
            source,
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        let mut text = hex_encode(&self.bytes);
        text.push('\n');
        f.write_all(text.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)
    }

    /// Loads the key at `path`, or generates and writes one if the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        match Self::load(path) {
            Err(KeyError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate()?;
                match key.write_new(path) {
                    Ok(()) => Ok(key),
                    // Another process created it between our read and write: use theirs.
                    Err(KeyError::Write { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        Self::load(path)
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
    }

    /// Loads a key file, refusing one that group or others may read.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let read_err = |source| KeyError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = fs::metadata(path).map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        // A Kubernetes Secret mounted with `defaultMode: 0400` in a pod with `fsGroup` is
        // `root:<fsGroup> 0440` (the kubelet adds group read to every file): accepted, as
        // PostgreSQL accepts root-owned keys its group may read. Writable or
        // world-readable is still refused.
        let kubernetes_secret = {
            use std::os::unix::fs::MetadataExt as _;
            meta.uid() == 0 && mode & 0o277 == 0o040
        };
        if mode & 0o077 != 0 && !kubernetes_secret {
            return Err(KeyError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        let text = fs::read_to_string(path).map_err(read_err)?;
        let bytes = hex_decode(text.trim()).ok_or_else(|| KeyError::Malformed {
            path: path.to_owned(),
            expected: KEY_LEN * 2,
        })?;
        Ok(Self { bytes })
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; ours is always 32 bytes.
        match HmacSha256::new_from_slice(&self.bytes) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 accepts any key length"),
        }
    }

    /// Signs an identity credential issued at `iat` and valid [`DEFAULT_LIFETIME`] seconds.
    pub fn sign(&self, identity: &Identity, iat: i64) -> String {
        self.issue(identity, "", iat, DEFAULT_LIFETIME).0
    }

    /// Issues an identity credential from `host`, valid `lifetime` seconds from `now`
    /// (clamped to 1..=[`MAX_LIFETIME`]), with a fresh nonce. Returns it and its expiry.
    pub fn issue(&self, identity: &Identity, host: &str, now: i64, lifetime: i64) -> (String, i64) {
        let exp = now.saturating_add(lifetime.clamp(1, MAX_LIFETIME));
        let claims = credential::Claims::Identity(credential::IdentityClaims {
            user: identity.user.clone(),
            uid: identity.uid,
            gid: identity.gid,
            role: identity.role,
            host: host.to_owned(),
            iat: now,
            exp,
            nonce: credential::nonce_hex(credential::new_nonce()),
        });
        (credential::encode(&claims, self.mac()), exp)
    }

    /// Signs a step launch grant valid `lifetime` seconds from `now`.
    pub fn issue_step(&self, grant: &StepGrant, now: i64, lifetime: i64) -> String {
        let claims = credential::Claims::Step(credential::StepClaims {
            job: grant.job_id,
            step: grant.step_id,
            nodes: grant.nodes.clone(),
            uid: grant.uid,
            gid: grant.gid,
            iat: now,
            exp: now.saturating_add(lifetime.clamp(1, MAX_LIFETIME)),
            nonce: credential::nonce_hex(credential::new_nonce()),
        });
        credential::encode(&claims, self.mac())
    }

    /// Verifies an identity credential now (signature, shape, expiry).
    pub fn verify(&self, token: &str) -> Result<Identity, TokenError> {
        self.verify_at(token, unix_now()).map(|c| c.identity)
    }

    /// Verifies an identity credential at time `now`.
    pub fn verify_at(&self, token: &str, now: i64) -> Result<Credential, TokenError> {
        match credential::decode(token, self.mac())? {
            credential::Claims::Identity(c) => {
                credential::check_time(c.iat, c.exp, now)?;
                credential::credential_of(c)
            }
            credential::Claims::Step(_) => Err(TokenError::WrongKind),
        }
    }

    /// Verifies a step launch grant at time `now`.
    pub fn verify_step(&self, token: &str, now: i64) -> Result<StepGrant, TokenError> {
        match credential::decode(token, self.mac())? {
            credential::Claims::Step(c) => {
                credential::check_time(c.iat, c.exp, now)?;
                Ok(credential::grant_of(c))
            }
            credential::Claims::Identity(_) => Err(TokenError::WrongKind),
        }
    }

    /// The bearer token of a request's metadata.
    pub fn bearer(meta: &MetadataMap) -> Result<&str, TokenError> {
        let value = meta.get(AUTH_HEADER).ok_or(TokenError::Missing)?;
        let value = value.to_str().map_err(|_| TokenError::NotBearer)?;
        let token = value.strip_prefix("Bearer ").ok_or(TokenError::NotBearer)?;
        Ok(token.trim())
    }

    /// Verifies the `authorization` metadata of a request now (no replay check).
    pub fn verify_metadata(&self, meta: &MetadataMap) -> Result<Identity, TokenError> {
        self.verify(Self::bearer(meta)?)
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn hex_decode(text: &str) -> Option<[u8; KEY_LEN]> {
    let text = text.as_bytes();
    if text.len() != KEY_LEN * 2 {
        return None;
    }
    let mut out = [0u8; KEY_LEN];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::test_util::{alice, key};
    use crate::auth::{CLOCK_SKEW, MAX_TOKEN_LEN};
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    /// Signs arbitrary payload bytes as a v1 credential (for tests of what the MAC covers).
    fn sign_raw(k: &ClusterKey, payload_json: &[u8]) -> String {
        let payload = URL_SAFE_NO_PAD.encode(payload_json);
        let signed = format!("v1.{payload}");
        let mut mac = k.mac();
        mac.update(signed.as_bytes());
        format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn round_trip_keeps_identity_host_and_window() {
        let k = key(7);
        let (token, exp) = k.issue(&alice(), "login1", 1_700_000_000, 300);
        assert!(token.starts_with("v1."));
        assert_eq!(exp, 1_700_000_300);
        let c = k.verify_at(&token, 1_700_000_001).unwrap();
        assert_eq!(c.identity, alice());
        assert_eq!(c.host, "login1");
        assert_eq!((c.iat, c.exp), (1_700_000_000, 1_700_000_300));
    }

    #[test]
    fn expired_and_future_credentials_are_refused() {
        let k = key(7);
        let (token, _) = k.issue(&alice(), "", 1_000, 300);
        assert!(matches!(
            k.verify_at(&token, 1_300),
            Err(TokenError::Expired { .. })
        ));
        assert!(matches!(
            k.verify_at(&token, 1_000 - CLOCK_SKEW - 1),
            Err(TokenError::NotYetValid { .. })
        ));
        assert!(k.verify_at(&token, 1_000 - CLOCK_SKEW).is_ok());
    }

    #[test]
    fn lifetimes_are_capped_when_issued_and_when_verified() {
        let k = key(7);
        let (token, exp) = k.issue(&alice(), "", 0, 1_000_000);
        assert_eq!(exp, MAX_LIFETIME);
        assert!(k.verify_at(&token, 1).is_ok());
        // A key holder hand-crafting a longer one is refused anyway.
        let long = sign_raw(
            &k,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":99999,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
        );
        assert!(matches!(
            k.verify_at(&long, 1),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn nonces_differ() {
        let k = key(7);
        let a = k.verify_at(&k.sign(&alice(), 5), 6).unwrap();
        let b = k.verify_at(&k.sign(&alice(), 5), 6).unwrap();
        assert_ne!(a.nonce, b.nonce);
    }

    #[test]
    fn tampered_payload_is_rejected() {
        let k = key(7);
        let token = k.sign(&alice(), 1);
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap())
                .unwrap()
                .replace("\"uid\":1000", "\"uid\":0"),
        );
        assert_ne!(forged, parts[1]);
        parts[1] = &forged;
        assert_eq!(
            k.verify_at(&parts.join("."), 2),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn wrong_key_version_and_kind_are_rejected() {
        let token = key(7).sign(&alice(), 1);
        assert_eq!(key(8).verify_at(&token, 2), Err(TokenError::BadSignature));
        let v2 = token.replacen("v1.", "v2.", 1);
        assert!(matches!(
            key(7).verify_at(&v2, 2),
            Err(TokenError::UnsupportedVersion(_))
        ));
        let grant = StepGrant {
            job_id: 1,
            step_id: 0,
            nodes: vec!["n1".into()],
            uid: 1000,
            gid: 1000,
            exp: 0,
        };
        let step = key(7).issue_step(&grant, 1, 60);
        assert_eq!(key(7).verify_at(&step, 2), Err(TokenError::WrongKind));
        assert_eq!(key(7).verify_step(&token, 2), Err(TokenError::WrongKind));
        let back = key(7).verify_step(&step, 2).unwrap();
        assert_eq!((back.job_id, back.nodes, back.exp), (1, grant.nodes, 61));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        let k = key(7);
        for bad in [
            "",
            "nodot",
            "a.b.c",
            "!!!.!!!",
            "e30.AAAA",
            "v1.e30.AAAA",
            "v1...",
        ] {
            assert!(k.verify_at(bad, 0).is_err(), "{bad:?} accepted");
        }
        // Correctly signed payloads that are not valid claims.
        for json in [
            &b"[1,2]"[..],
            br#"{"kind":"identity"}"#,
            br#"{"kind":"other","user":"a"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"zz"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"god","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":10,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f","extra":1}"#,
        ] {
            assert!(
                matches!(k.verify_at(&sign_raw(&k, json), 1), Err(TokenError::Malformed(_))),
                "{} accepted",
                String::from_utf8_lossy(json)
            );
        }
        let huge = "v1.".to_owned() + &"A".repeat(MAX_TOKEN_LEN) + ".AAAA";
        assert!(matches!(
            k.verify_at(&huge, 0),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn key_file_round_trip_and_permission_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let k = ClusterKey::load_or_create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = ClusterKey::load(&path).unwrap();
        assert_eq!(again.bytes, k.bytes);
        // A second load_or_create keeps the existing key.
        assert_eq!(ClusterKey::load_or_create(&path).unwrap().bytes, k.bytes);
        assert!(matches!(k.write_new(&path), Err(KeyError::Write { .. })));

        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err();
        assert!(matches!(err, KeyError::Permissions { mode: 0o640, .. }));
        assert!(err.to_string().contains("chmod 600"));
        // A Secret mounted with defaultMode 0400 and fsGroup: 0440, accepted when root
        // owns it (as the kubelet makes it), refused otherwise.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o440)).unwrap();
        let root_owned = {
            use std::os::unix::fs::MetadataExt as _;
            fs::metadata(&path).unwrap().uid() == 0
        };
        assert_eq!(ClusterKey::load(&path).is_ok(), root_owned);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
        assert!(ClusterKey::load(&path).is_err(), "others may never read it");
    }

    #[test]
    fn malformed_key_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        fs::write(&path, "not hex\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            ClusterKey::load(&path),
            Err(KeyError::Malformed { .. })
        ));
    }

    #[test]
    fn debug_does_not_leak_key() {
        assert_eq!(format!("{:?}", key(0xab)), "ClusterKey(..)");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any string: no panic, and nothing but a real credential is accepted.
            #[test]
            fn arbitrary_text_is_refused(s in ".{0,400}") {
                let k = key(9);
                prop_assert!(k.verify_at(&s, 0).is_err());
                prop_assert!(k.verify_step(&s, 0).is_err());
            }

            /// Text shaped like a credential (three dot-separated base64url parts).
            #[test]
            fn credential_shaped_text_is_refused(
                v in "v[0-9]{1,2}",
                p in "[A-Za-z0-9_-]{0,200}",
                sig in "[A-Za-z0-9_-]{0,60}",
            ) {
                let k = key(9);
                let t = format!("{v}.{p}.{sig}");
                prop_assert!(k.verify_at(&t, 0).is_err());
            }

            /// Signed claims of any JSON value: refused unless exactly the claims shape.
            #[test]
            fn signed_junk_json_is_refused(
                user in ".{0,20}",
                uid in any::<u32>(),
                iat in any::<i64>(),
                exp in any::<i64>(),
                nonce in "[0-9a-fg]{0,40}",
                extra in proptest::option::of("[a-z]{1,8}"),
            ) {
                let k = key(9);
                let mut obj = serde_json::json!({
                    "kind": "identity", "user": user, "uid": uid, "gid": 1, "role": "user",
                    "host": "", "iat": iat, "exp": exp, "nonce": nonce,
                });
                if let Some(x) = &extra {
                    obj[x] = serde_json::json!(1);
                }
                let t = sign_raw(&k, obj.to_string().as_bytes());
                let ok_shape = !user.is_empty()
                    && nonce.len() == 32 && !nonce.contains('g')
                    && exp > iat && exp.saturating_sub(iat) <= MAX_LIFETIME
                    && extra.as_deref().is_none_or(|x| ![
                        "kind","user","uid","gid","role","host","iat","exp","nonce"
                    ].contains(&x));
                let r = k.verify_at(&t, iat);
                if !ok_shape {
                    prop_assert!(r.is_err(), "accepted {obj}");
                } else if let Ok(c) = r {
                    prop_assert_eq!(c.identity.uid, uid);
                }
            }

            /// Flipping any one character of a real credential breaks it.
            #[test]
            fn any_single_change_is_refused(pos in any::<prop::sample::Index>(), c in "[A-Za-z0-9_.-]") {
                let k = key(9);
                let t = k.sign(&alice(), 100);
                let i = pos.index(t.len());
                let mut b = t.clone().into_bytes();
                let nc = c.as_bytes()[0];
                prop_assume!(b[i] != nc);
                b[i] = nc;
                let t2 = String::from_utf8(b).unwrap();
                prop_assert!(k.verify_at(&t2, 101).is_err());
            }
        }
    }
}
