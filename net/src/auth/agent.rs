//! The local identity agent's wire protocol (`tandem authd`, like munged or sackd).
//!
//! The agent listens on a Unix socket any local user may connect to. A client connects and
//! writes one line, [`REQUEST`]; the agent learns the caller's uid and gid from the kernel
//! (`SO_PEERCRED`, never from anything the client says), signs an identity credential for
//! them with the cluster key it alone can read, and answers one JSON line ([`Reply`]), then
//! closes. One round trip per client process.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ClusterKey, Identity};

/// What a client writes.
pub const REQUEST: &[u8] = b"TANDEM-AUTH 1\n";
/// Largest reply a client reads.
pub const MAX_REPLY: u64 = 64 * 1024;
/// How long a client waits for the agent.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub v: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    #[serde(default)]
    pub exp: i64,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "cannot reach the identity agent at {path} (is `tandem authd` running? `tandem up` starts one)"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the identity agent at {path} did not answer")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the identity agent at {path} sent a malformed reply")]
    Malformed { path: PathBuf },
    #[error("the identity agent refused: {0}")]
    Refused(String),
}

/// The credential the agent issued and whom it names.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub identity: Identity,
    pub exp: i64,
}

/// The agent's side: the reply for a caller whose uid/gid the kernel reported.
pub fn reply_for(key: &ClusterKey, user: &str, uid: u32, gid: u32, host: &str, now: i64) -> Reply {
    // Identity::user makes uid 0 an admin: only root itself gets a root credential, since
    // the uid comes from the kernel.
    let identity = Identity::user(user, uid, gid);
    let (token, exp) = key.issue(&identity, host, now, super::DEFAULT_LIFETIME);
    Reply {
        v: 1,
        token,
        exp,
        user: identity.user,
        uid,
        gid,
        error: String::new(),
    }
}

/// Parses an agent reply (the client's side; never panics on any input).
pub fn parse_reply(bytes: &[u8], path: &Path) -> Result<Issued, AgentError> {
    let malformed = || AgentError::Malformed {
        path: path.to_owned(),
    };
    let reply: Reply = serde_json::from_slice(bytes).map_err(|_| malformed())?;
    if reply.v != 1 {
        return Err(malformed());
    }
    if !reply.error.is_empty() {
        return Err(AgentError::Refused(reply.error));
    }
    if reply.token.is_empty() || reply.token.len() > super::MAX_TOKEN_LEN || reply.user.is_empty() {
        return Err(malformed());
    }
    Ok(Issued {
        identity: Identity::user(reply.user, reply.uid, reply.gid),
        token: reply.token,
        exp: reply.exp,
    })
}

/// Asks the agent at `path` for a credential (blocking; about a hundred microseconds).
pub fn request(path: &Path) -> Result<Issued, AgentError> {
    let io = |source| AgentError::Io {
        path: path.to_owned(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(|source| AgentError::Connect {
        path: path.to_owned(),
        source,
    })?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    s.write_all(REQUEST).map_err(io)?;
    let mut buf = Vec::new();
    (&mut s).take(MAX_REPLY).read_to_end(&mut buf).map_err(io)?;
    parse_reply(&buf, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_round_trip_and_refusals() {
        let key = ClusterKey::from_bytes([3; super::super::KEY_LEN]);
        let r = reply_for(&key, "alice", 1000, 100, "login1", 1_000);
        let bytes = serde_json::to_vec(&r).unwrap();
        let issued = parse_reply(&bytes, Path::new("/s")).unwrap();
        assert_eq!(issued.identity, Identity::user("alice", 1000, 100));
        let cred = key.verify_at(&issued.token, 1_001).unwrap();
        assert_eq!(cred.identity.uid, 1000);
        assert_eq!(cred.host, "login1");
        assert_eq!(cred.exp, 1_000 + super::super::DEFAULT_LIFETIME);

        let refused = br#"{"v":1,"error":"no"}"#;
        assert!(matches!(
            parse_reply(refused, Path::new("/s")),
            Err(AgentError::Refused(_))
        ));
        for bad in [
            &b""[..],
            b"{",
            b"{\"v\":2,\"token\":\"x\",\"user\":\"a\"}",
            b"[]",
        ] {
            assert!(parse_reply(bad, Path::new("/s")).is_err());
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever an impostor on the socket path answers, the client never panics and
            /// accepts only a well-formed v1 reply.
            #[test]
            fn arbitrary_replies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let r = parse_reply(&bytes, Path::new("/s"));
                if let Ok(issued) = r {
                    prop_assert!(!issued.token.is_empty() && !issued.identity.user.is_empty());
                }
            }

            #[test]
            fn json_shaped_replies_are_checked(
                v in 0u32..3,
                token in "[A-Za-z0-9._-]{0,40}",
                user in "[a-z]{0,8}",
                error in "[a-z ]{0,10}",
            ) {
                let text = serde_json::json!({"v": v, "token": token, "user": user, "uid": 5, "gid": 5, "error": error}).to_string();
                let r = parse_reply(text.as_bytes(), Path::new("/s"));
                let good = v == 1 && error.is_empty() && !token.is_empty() && !user.is_empty();
                prop_assert_eq!(r.is_ok(), good);
            }
        }
    }
}
