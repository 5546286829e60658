//! The HTTPS server: `/mutate`, `/validate`, `/guard`, `/healthz`, `/readyz`.
//!
//! TLS (rustls) with the serving certificate and key read from PEM files, read again when
//! either file changes (a Secret volume is updated in place by the kubelet), so a rotated
//! certificate needs no restart. Handshakes run in their own tasks: a client that stalls
//! its handshake delays nobody else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{info, warn};

use super::admit::Mode;
use super::review::respond;
use super::state::Policies;

/// Where to listen and what to serve with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("the key does not suit the certificate: {0}")]
    Key(#[source] rustls::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How often the certificate files are looked at.
const RELOAD_EVERY: Duration = Duration::from_secs(10);
/// A TLS handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running server; dropping it stops it.
#[derive(Debug)]
pub struct Running {
    pub local_addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Reads the certificate, binds, and serves in the background. Errors here (a missing
/// file, a port in use) are the caller's to report; once serving, failures are logged.
pub async fn start(cfg: Config, policies: Arc<Policies>) -> Result<Running, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = Arc::new(Reloading::load(&cfg, provider.clone())?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::Tls)?
        .with_no_client_auth()
        .with_cert_resolver(certs.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Accepted through Tandem's one socket factory: `TCP_NODELAY` on every connection.
    let tcp = tandem_net::net::bind(cfg.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: cfg.listen,
            source,
        })?;
    let local_addr = tcp.local_addr().map_err(|source| Error::Listen {
        addr: cfg.listen,
        source,
    })?;
    let (tx, rx) = mpsc::channel(64);
    let accept = tokio::spawn(accept_loop(tcp, TlsAcceptor::from(Arc::new(tls)), tx));
    let reload = tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        loop {
            tick.tick().await;
            certs.reload_if_changed();
        }
    });
    let app = router(policies);
    let listener = Incoming { rx, local_addr };
    let serve = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "webhook server stopped");
        }
    });
    // The address in the message itself: with port 0, this is how it is learnt.
    info!("webhook serving /mutate, /validate and /guard over TLS on {local_addr}");
    Ok(Running {
        local_addr,
        tasks: vec![accept, reload, serve],
    })
}

fn router(policies: Arc<Policies>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/guard", post(guard))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(policies)
}

async fn mutate(State(p): State<Arc<Policies>>, body: Bytes) -> axum::Json<serde_json::Value> {
    answer(Mode::Mutate, &p, &body)
}

async fn validate(State(p): State<Arc<Policies>>, body: Bytes) -> axum::Json<serde_json::Value> {
    answer(Mode::Validate, &p, &body)
}

async fn guard(State(p): State<Arc<Policies>>, body: Bytes) -> axum::Json<serde_json::Value> {
    answer(Mode::Guard, &p, &body)
}

fn answer(mode: Mode, p: &Policies, body: &[u8]) -> axum::Json<serde_json::Value> {
    axum::Json(p.with_view(|view| respond(mode, body, view)))
}

/// Ready once the namespace map and the Node list have been read: before that every
/// managed pod, and every pod naming a node, would be refused.
async fn readyz(State(p): State<Arc<Policies>>) -> (StatusCode, &'static str) {
    if p.ready() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "namespace map or Node list not read yet",
        )
    }
}

async fn accept_loop(
    tcp: tandem_net::net::Listener,
    tls: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (stream, addr) = match tcp.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: pause rather than spin.
                warn!(error = %e, "webhook accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (tls, tx) = (tls.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(s)) => {
                    let _ = tx.send((s, addr)).await;
                }
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "webhook TLS handshake"),
                Err(_) => tracing::debug!(%addr, "webhook TLS handshake timed out"),
            }
        });
    }
}

/// Connections whose handshake completed, for axum.
struct Incoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl axum::serve::Listener for Incoming {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept loop ended (the server is being dropped): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

/// The serving certificate, read again when its files change.
#[derive(Debug)]
struct Reloading {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Stamp, Arc<CertifiedKey>)>,
}

/// What tells a changed file: modification time and length of both files.
type Stamp = [Option<(SystemTime, u64)>; 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    [one(cert), one(key)]
}

impl Reloading {
    fn load(cfg: &Config, provider: Arc<CryptoProvider>) -> Result<Self, Error> {
        let s = stamp(&cfg.cert_file, &cfg.key_file);
        let key = read_key(&cfg.cert_file, &cfg.key_file, &provider)?;
        Ok(Self {
            cert_file: cfg.cert_file.clone(),
            key_file: cfg.key_file.clone(),
            provider,
            current: RwLock::new((s, Arc::new(key))),
        })
    }

    fn reload_if_changed(&self) {
        let s = stamp(&self.cert_file, &self.key_file);
        if self.current.read().map(|c| c.0 == s).unwrap_or(false) {
            return;
        }
        match read_key(&self.cert_file, &self.key_file, &self.provider) {
            Ok(k) => {
                info!(cert = %self.cert_file.display(), "webhook certificate reloaded");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (s, Arc::new(k));
            }
            // Half-written files (the cert updated, the key not yet): keep serving the old
            // pair and look again at the next tick.
            Err(e) => warn!(error = %e, "webhook certificate not reloaded; keeping the old one"),
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let c = self.current.read().unwrap_or_else(|e| e.into_inner());
        Some(c.1.clone())
    }
}

fn read_key(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let pem_err = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Pem { path, source }
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(pem_err(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err(cert))?;
    if chain.is_empty() {
        return Err(Error::NoCertificate(cert.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem_err(key))?;
    CertifiedKey::from_der(chain, key, provider).map_err(Error::Key)
}
