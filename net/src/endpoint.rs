//! How a client finds its cluster, and authenticated channels to it.
//!
//! # Resolution order
//!
//! 1. The cluster file at `$TANDEM_CONFIG`, else `$HOME/.tandem/cluster.json`:
//!    `{ "cluster_name": "...", "controller": "https://127.0.0.1:PORT", "key_file": "/path/key",
//!    "auth_socket": "/path/authd.sock", "ca_file": "/path/ca.crt" }`.
//!    `tandem up --state-dir DIR` writes `DIR/cluster.json` (and the home one by default).
//!    `"local_socket": "/path/controller.sock"` names the controller's Unix socket when the
//!    controller runs on this host (see below).
//! 2. `$TANDEM_CONTROLLER` overrides the address, `$TANDEM_KEY_FILE` the key file,
//!    `$TANDEM_AUTH_SOCKET` the identity agent's socket and `$TANDEM_CA_FILE` the CA; with the
//!    address and the key or socket set no file is needed at all (how pods and tests are
//!    wired).
//!
//! # Transport
//!
//! With a CA ([`Endpoint::security`]) every connection is TLS and the server must present a
//! certificate the CA issued for the address's host. Without one a client speaks plain text,
//! and only to a loopback address: a credential never crosses a network in clear.
//!
//! # The local socket
//!
//! When the cluster file names a `local_socket` (and `$TANDEM_CONTROLLER` does not point
//! elsewhere), a client tries it first ([`crate::net::connect_local`]): on the
//! controller's host that saves the TCP and TLS handshakes and the credential, the kernel
//! naming the caller. If nothing answers there (another host, a stopped controller) it
//! uses the address as always. `$TANDEM_LOCAL_SOCKET` overrides the path; set and empty,
//! it turns the local socket off.
//!
//! # Credentials
//!
//! [`Endpoint::client_auth`] asks the identity agent (`tandem authd`) when a socket is known,
//! and falls back to signing with the key when this process can read it (the key's owner).
//! A user who can do neither gets an error naming both.
//!
//! Environment variables are read through a lookup function so tests pass a map instead of
//! mutating the process environment (`set_var` is racy and banned by `clippy.toml`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::auth::{AgentSource, ClientAuth, ClusterKey, Identity, KeyError, KeySigner};
use crate::net::ClientSecurity;
/// The client's call timeout is the socket layer's ([`crate::net`]): the local socket's
/// connections are timed by it too.
pub use crate::net::{ENV_MSG_TIMEOUT, message_timeout};
use crate::tls::TlsError;

pub const ENV_CONFIG: &str = "TANDEM_CONFIG";
pub const ENV_CONTROLLER: &str = "TANDEM_CONTROLLER";
pub const ENV_KEY_FILE: &str = "TANDEM_KEY_FILE";
pub const ENV_AUTH_SOCKET: &str = "TANDEM_AUTH_SOCKET";
pub const ENV_CA_FILE: &str = "TANDEM_CA_FILE";
pub const ENV_LOCAL_SOCKET: &str = "TANDEM_LOCAL_SOCKET";
pub const DEFAULT_CLUSTER_NAME: &str = "tandem";

/// Largest response a client should accept. tonic's default (4 MiB) is too small for
/// `ListJobs` over ~35,000 jobs; pass this to `.max_decoding_message_size(..)` on clients
/// that list jobs, nodes or accounting records.
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// A channel whose every request carries a signed token. Wrap it in any generated client:
/// `JobsClient::new(channel.clone())`.
pub type AuthChannel = InterceptedService<Channel, ClientAuth>;

/// The on-disk cluster file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    pub cluster_name: String,
    /// `http[s]://HOST:PORT` of the controller's gRPC server.
    pub controller: String,
    pub key_file: PathBuf,
    /// The identity agent's Unix socket (`tandem authd`), if one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_socket: Option<PathBuf>,
    /// The cluster CA (PEM) that every Tandem server's certificate chains to; absent: plain
    /// text, to loopback addresses only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The controller's Unix socket, for clients on its host (`--local-socket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_socket: Option<PathBuf>,
}

impl ClusterFile {
    /// Writes the file atomically (temp file + rename) so a reader never sees half of it.
    pub fn write(&self, path: &Path) -> Result<(), EndpointError> {
        let err = |source| EndpointError::Write {
            path: path.to_owned(),
            source,
        };
        let json = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    pub fn read(path: &Path) -> Result<Self, EndpointError> {
        let text = std::fs::read_to_string(path).map_err(|source| EndpointError::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| EndpointError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// Where the controller is and which key proves membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub cluster_name: String,
    pub controller: String,
    pub key_file: PathBuf,
    pub auth_socket: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// The controller's Unix socket, tried before `controller` (see the module notes).
    pub local_socket: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "no Tandem cluster found: {path} does not exist; start one with `tandem up` or set {ENV_CONFIG} (or {ENV_CONTROLLER} and {ENV_KEY_FILE})"
    )]
    NotFound { path: PathBuf },
    #[error("cannot locate the cluster file: neither {ENV_CONFIG} nor HOME is set")]
    NoHome,
    #[error(
        "{ENV_CONTROLLER} is set but neither a key file nor an identity agent is known; set {ENV_AUTH_SOCKET} or {ENV_KEY_FILE}"
    )]
    NoKeyFile,
    #[error("no credentials: {agent}; and the cluster key is not usable: {key}")]
    NoCredentials { agent: String, key: String },
    #[error("cannot read cluster file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write cluster file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster file {path} is malformed")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid controller address {address:?} (expected http://HOST:PORT)")]
    InvalidAddress { address: String },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(
        "no CA to verify {address} against: plain text is only for loopback addresses; set {ENV_CA_FILE} or the cluster file's ca_file"
    )]
    NoCa { address: String },
    #[error(
        "node name {node:?} cannot be verified in a certificate (not a DNS name or IP address)"
    )]
    InvalidNodeName { node: String },
    #[error("cannot connect to the controller at {address}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to the step service of node {node} at {address}")]
    ConnectNode {
        node: String,
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Finds the cluster from the process environment.
pub fn discover() -> Result<Endpoint, EndpointError> {
    discover_with(&|k| std::env::var(k).ok())
}

/// Finds the cluster using `env` to read environment variables.
pub fn discover_with(env: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint, EndpointError> {
    let nonempty = |k: &str| env(k).filter(|v| !v.is_empty());
    let addr_override = nonempty(ENV_CONTROLLER);
    let key_override = nonempty(ENV_KEY_FILE).map(PathBuf::from);
    let socket_override = nonempty(ENV_AUTH_SOCKET).map(PathBuf::from);
    let ca_override = nonempty(ENV_CA_FILE).map(PathBuf::from);
    let creds_override = key_override.is_some() || socket_override.is_some();

    let explicit = nonempty(ENV_CONFIG).map(PathBuf::from);
    let path = match (&explicit, nonempty("HOME")) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(home)) => Some(Path::new(&home).join(".tandem").join("cluster.json")),
        (None, None) => None,
    };

    let file = match &path {
        Some(p) if p.exists() => Some(ClusterFile::read(p)?),
        // An explicitly named file must exist; the default one is optional when both
        // overrides are given.
        Some(p) if explicit.is_some() || addr_override.is_none() || !creds_override => {
            return Err(EndpointError::NotFound { path: p.clone() });
        }
        None if addr_override.is_none() || !creds_override => {
            return Err(EndpointError::NoHome);
        }
        _ => None,
    };

    let (cluster_name, controller, key_file, auth_socket, ca_file, local_socket) = match file {
        Some(f) => (
            f.cluster_name,
            f.controller,
            f.key_file,
            f.auth_socket,
            f.ca_file,
            f.local_socket,
        ),
        None => (
            DEFAULT_CLUSTER_NAME.to_owned(),
            String::new(),
            PathBuf::new(),
            None,
            None,
            None,
        ),
    };
    // The file's socket belongs to the file's controller: not to an address set over it.
    let local_socket = match env(ENV_LOCAL_SOCKET) {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None if addr_override.is_some() => None,
        None => local_socket,
    };
    let ca_file = ca_override.or(ca_file);
    let controller = addr_override.unwrap_or(controller);
    let key_file = key_override.unwrap_or(key_file);
    let auth_socket = socket_override.or(auth_socket);
    if key_file.as_os_str().is_empty() && auth_socket.is_none() {
        return Err(EndpointError::NoKeyFile);
    }
    Ok(Endpoint {
        cluster_name,
        controller: normalize_address(&controller)?,
        key_file,
        auth_socket,
        ca_file,
        local_socket,
    })
}

/// Accepts `HOST:PORT` as well as `http://HOST:PORT` and `https://HOST:PORT`.
pub fn normalize_address(address: &str) -> Result<String, EndpointError> {
    let invalid = || EndpointError::InvalidAddress {
        address: address.to_owned(),
    };
    let a = address.trim();
    if a.is_empty() {
        return Err(invalid());
    }
    let full = if a.contains("://") {
        a.to_owned()
    } else {
        format!("http://{a}")
    };
    let uri: tonic::transport::Uri = full.parse().map_err(|_| invalid())?;
    if uri.host().is_none() || uri.port_u16().is_none() {
        return Err(invalid());
    }
    Ok(full)
}

impl Endpoint {
    pub fn load_key(&self) -> Result<ClusterKey, EndpointError> {
        Ok(ClusterKey::load(&self.key_file)?)
    }

    /// Credentials for this process: from the identity agent if one is known and answers,
    /// else signed with the key as `fallback` if this process can read it. The identity
    /// the credentials carry is [`ClientAuth::identity`] (the agent's word, from the kernel).
    pub fn client_auth(&self, fallback: &Identity) -> Result<ClientAuth, EndpointError> {
        let agent_err = match &self.auth_socket {
            Some(socket) => {
                match ClientAuth::from_source(std::sync::Arc::new(AgentSource {
                    socket: socket.clone(),
                })) {
                    Ok(auth) => return Ok(auth),
                    Err(e) => e,
                }
            }
            None => "no identity agent is configured".to_owned(),
        };
        if self.key_file.as_os_str().is_empty() {
            return Err(EndpointError::NoCredentials {
                agent: agent_err,
                key: "no key file is configured".to_owned(),
            });
        }
        match self.load_key() {
            Ok(key) => ClientAuth::from_source(std::sync::Arc::new(KeySigner {
                key,
                identity: fallback.clone(),
                host: String::new(),
            }))
            .map_err(|key| EndpointError::NoCredentials {
                agent: agent_err,
                key,
            }),
            Err(e) if self.auth_socket.is_none() => Err(e),
            Err(e) => Err(EndpointError::NoCredentials {
                agent: agent_err,
                key: crate::auth::error_chain(&e),
            }),
        }
    }

    /// How to reach this cluster's servers (the controller, and the workers' step services
    /// for srun): TLS verified against the CA when one is known, else plain text to a
    /// loopback controller only. Reads the CA file once; share the result.
    pub fn security(&self) -> Result<ClientSecurity, EndpointError> {
        security_for(&self.controller, self.ca_file.as_deref())
    }

    /// Gets credentials ([`Endpoint::client_auth`]) and connects.
    pub async fn connect(&self, identity: &Identity) -> Result<AuthChannel, EndpointError> {
        let auth = self.client_auth(identity)?;
        connect_with(&self.controller, &self.security()?, auth).await
    }
}

/// TLS against `ca` if given; else plain text, allowed only to a loopback `address`.
pub fn security_for(address: &str, ca: Option<&Path>) -> Result<ClientSecurity, EndpointError> {
    match ca {
        Some(ca) => Ok(ClientSecurity::Tls(crate::tls::client_config(ca)?)),
        None if crate::tls::is_loopback_address(address) => Ok(ClientSecurity::Plaintext),
        None => Err(EndpointError::NoCa {
            address: address.to_owned(),
        }),
    }
}

/// Connects to `address` secured as `security` says; every request carries `auth`'s
/// credential, and gets [`message_timeout`] to be answered.
pub async fn connect_with(
    address: &str,
    security: &ClientSecurity,
    auth: ClientAuth,
) -> Result<AuthChannel, EndpointError> {
    connect_verifying(address, None, security, auth).await
}

/// Connects to the step service of worker `node` at `address` (what the worker
/// advertises: on Kubernetes its pod IP) as [`connect_with`] does, except that with TLS
/// the certificate must name `node`, not the address: a worker's step certificate is issued
/// for its node name, the one name known before its pod runs ([`crate::net`]). A worker
/// holding a certificate for another node is refused at any address.
pub async fn connect_to_node(
    address: &str,
    node: &str,
    security: &ClientSecurity,
    auth: ClientAuth,
) -> Result<AuthChannel, EndpointError> {
    if rustls::pki_types::ServerName::try_from(node).is_err() {
        return Err(EndpointError::InvalidNodeName {
            node: node.to_owned(),
        });
    }
    connect_verifying(address, Some(node), security, auth).await
}

async fn connect_verifying(
    address: &str,
    verify: Option<&str>,
    security: &ClientSecurity,
    auth: ClientAuth,
) -> Result<AuthChannel, EndpointError> {
    let address = normalize_address(address)?;
    let endpoint = tonic::transport::Endpoint::from_shared(address.clone())
        .map_err(|_| EndpointError::InvalidAddress {
            address: address.clone(),
        })?
        .connect_timeout(Duration::from_secs(5))
        .timeout(message_timeout());
    let channel = match verify {
        Some(node) => crate::net::connect_verifying(&endpoint, security, node)
            .await
            .map_err(|source| EndpointError::ConnectNode {
                node: node.to_owned(),
                address,
                source,
            })?,
        None => crate::net::connect(&endpoint, security)
            .await
            .map_err(|source| EndpointError::Connect { address, source })?,
    };
    Ok(InterceptedService::new(channel, auth))
}

/// Connects to `address` over `security` and signs every request as `identity`.
pub async fn connect_as(
    address: &str,
    security: &ClientSecurity,
    key: &ClusterKey,
    identity: &Identity,
) -> Result<AuthChannel, EndpointError> {
    connect_with(
        address,
        security,
        ClientAuth::new(key, identity, crate::auth::unix_now()),
    )
    .await
}

/// Connects to `address` in plain text and signs every request as `identity`: for servers
/// started with `--insecure-plaintext` (loopback development). Everything else uses
/// [`connect_as`] with the cluster's [`ClientSecurity`].
pub async fn connect(
    address: &str,
    key: &ClusterKey,
    identity: &Identity,
) -> Result<AuthChannel, EndpointError> {
    connect_as(address, &ClientSecurity::Plaintext, key, identity).await
}

/// Wraps an existing channel so its requests carry `identity`'s token.
pub fn authenticated(channel: Channel, key: &ClusterKey, identity: &Identity) -> AuthChannel {
    InterceptedService::new(
        channel,
        ClientAuth::new(key, identity, crate::auth::unix_now()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn write_file(dir: &Path, name: &str, addr: &str) -> PathBuf {
        let p = dir.join(name);
        ClusterFile {
            cluster_name: "c1".into(),
            controller: addr.into(),
            key_file: dir.join("key"),
            auth_socket: None,
            ca_file: None,
            local_socket: Some(dir.join("controller.sock")),
        }
        .write(&p)
        .unwrap();
        p
    }

    #[test]
    fn home_file_is_the_default() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".tandem")).unwrap();
        write_file(
            &home.path().join(".tandem"),
            "cluster.json",
            "http://127.0.0.1:7000",
        );
        let ep = discover_with(&env_of(&[("HOME", home.path().to_str().unwrap())])).unwrap();
        assert_eq!(ep.cluster_name, "c1");
        assert_eq!(ep.controller, "http://127.0.0.1:7000");
        assert_eq!(ep.key_file, home.path().join(".tandem").join("key"));
    }

    #[test]
    fn tandem_config_wins_over_home_and_overrides_apply() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_file(dir.path(), "cl.json", "127.0.0.1:7000");
        let ep = discover_with(&env_of(&[
            ("HOME", "/nonexistent"),
            (ENV_CONFIG, p.to_str().unwrap()),
            (ENV_CONTROLLER, "127.0.0.1:9"),
            (ENV_KEY_FILE, "/k"),
        ]))
        .unwrap();
        assert_eq!(ep.controller, "http://127.0.0.1:9");
        assert_eq!(ep.key_file, PathBuf::from("/k"));
        assert_eq!(ep.cluster_name, "c1");
    }

    #[test]
    fn the_local_socket_follows_the_file_unless_overridden() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_file(dir.path(), "cl.json", "127.0.0.1:7000");
        let config = (ENV_CONFIG, p.to_str().unwrap());
        let sock = dir.path().join("controller.sock");
        let ep = discover_with(&env_of(&[config])).unwrap();
        assert_eq!(ep.local_socket.as_deref(), Some(sock.as_path()));
        // Another controller address: the file's socket is not that controller's.
        let ep = discover_with(&env_of(&[config, (ENV_CONTROLLER, "10.0.0.9:7000")])).unwrap();
        assert_eq!(ep.local_socket, None);
        // Set and empty: off; set: that path.
        let ep = discover_with(&env_of(&[config, (ENV_LOCAL_SOCKET, "")])).unwrap();
        assert_eq!(ep.local_socket, None);
        let ep = discover_with(&env_of(&[config, (ENV_LOCAL_SOCKET, "/run/t.sock")])).unwrap();
        assert_eq!(ep.local_socket.as_deref(), Some(Path::new("/run/t.sock")));
    }

    #[test]
    fn an_agent_socket_alone_is_enough() {
        let ep = discover_with(&env_of(&[
            ("HOME", "/nonexistent"),
            (ENV_CONTROLLER, "http://127.0.0.1:9"),
            (ENV_AUTH_SOCKET, "/run/tandem/authd.sock"),
        ]))
        .unwrap();
        assert_eq!(
            ep.auth_socket.as_deref(),
            Some(Path::new("/run/tandem/authd.sock"))
        );
        // Neither agent nor key: the error names both.
        let err = Endpoint {
            auth_socket: Some(PathBuf::from("/nonexistent/sock")),
            key_file: PathBuf::from("/nonexistent/key"),
            ..ep
        }
        .client_auth(&Identity::user("a", 1, 1))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tandem authd") && err.contains("/nonexistent/key"),
            "{err}"
        );
    }

    #[test]
    fn overrides_alone_need_no_file() {
        let ep = discover_with(&env_of(&[
            ("HOME", "/nonexistent"),
            (ENV_CONTROLLER, "http://127.0.0.1:9"),
            (ENV_KEY_FILE, "/k"),
        ]))
        .unwrap();
        assert_eq!(ep.cluster_name, DEFAULT_CLUSTER_NAME);
    }

    #[test]
    fn missing_file_names_the_path_and_the_fix() {
        let err = discover_with(&env_of(&[("HOME", "/nonexistent")])).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/.tandem/cluster.json"), "{msg}");
        assert!(msg.contains("tandem up"), "{msg}");
        // An explicit TANDEM_CONFIG must exist even when overrides are given.
        let err = discover_with(&env_of(&[
            (ENV_CONFIG, "/nope.json"),
            (ENV_CONTROLLER, "127.0.0.1:1"),
            (ENV_KEY_FILE, "/k"),
        ]))
        .unwrap_err();
        assert!(matches!(err, EndpointError::NotFound { .. }));
    }

    #[test]
    fn malformed_file_and_address_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.json");
        std::fs::write(&p, "{not json").unwrap();
        let err = discover_with(&env_of(&[(ENV_CONFIG, p.to_str().unwrap())])).unwrap_err();
        assert!(matches!(err, EndpointError::Parse { .. }));

        for bad in ["", "nohostport", "http://", "http://host"] {
            assert!(normalize_address(bad).is_err(), "{bad:?} accepted");
        }
    }
}
