//! The worker's error type: everything that stops `run` or rejects a configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use tandem_net::auth::KeyError;
use tandem_net::endpoint::EndpointError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value is unusable; the message names the flag.
    #[error("invalid {flag}: {message}")]
    InvalidArgument { flag: &'static str, message: String },
    #[error("cannot find the controller")]
    Endpoint(#[from] EndpointError),
    #[error("cannot load the cluster key")]
    Key(#[from] KeyError),
    #[error(transparent)]
    Tls(#[from] tandem_net::tls::TlsError),
    #[error("cannot prepare the state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare the spool directory {path} (--spool-dir)")]
    SpoolDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen for step launches on {addr}")]
    BindStepListener {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the step launcher service failed")]
    StepServer(#[source] tonic::transport::Error),
}

impl Error {
    pub(crate) fn invalid(flag: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            flag,
            message: message.into(),
        }
    }
}
