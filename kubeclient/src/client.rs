//! Kubernetes API clients whose connections have `TCP_NODELAY`.
//!
//! kube-rs builds its connector with hyper-util's `HttpConnector` defaults, which leave
//! Nagle's algorithm on, and offers no hook to change that short of a custom stack. A
//! request or a binding written as more than one segment then waits for the API server's
//! delayed ACK (up to 40 ms) before its tail leaves; Go clients (client-go, kube-scheduler)
//! never pay this, since Go sets `TCP_NODELAY` on every connection. Tandem's rule is that
//! every socket it opens has the option (see `tandem_net::net`), so the operator and the
//! bridge build their clients here: kube-rs's own layers (base URI, retries of
//! server-side errors, authentication, extra headers, the configured timeouts) over a
//! connector with `TCP_NODELAY` set. A configuration with a proxy gets kube-rs's default
//! stack unchanged (the proxy tunnel is kube-rs's to build).

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt as _;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client for `config`, its connections with `TCP_NODELAY`.
pub fn client(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        tracing::debug!("a proxy is configured: kube-rs's default connector (Nagle on)");
        return Client::try_from(config);
    }
    let connector = TimeoutConnector::new(
        config.rustls_https_connector_with_connector(http_connector(config.connect_timeout))?,
    );
    let mut connector = connector;
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

/// Like [`infer`], but without kube-rs's retry of 429/503/504: for calls whose 429 is an
/// answer rather than overload. An eviction a PodDisruptionBudget refuses is answered 429,
/// and the default policy (15 tries, backing off to minutes) would hold the caller for
/// minutes instead of letting it back off and decide on its own.
pub async fn infer_without_retries() -> Result<Client, kube::Error> {
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    config.default_retry = false;
    client(config)
}

/// [`Client::try_default`], through [`client`]: the kubeconfig, else the in-cluster
/// service account.
pub async fn infer() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client(config)
}

fn http_connector(connect_timeout: Option<Duration>) -> HttpConnector {
    let mut http = HttpConnector::new();
    // `https://` URLs go through the TLS layer above this one.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(connect_timeout);
    http
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;

    /// `TCP_NODELAY` of this process's socket whose local port is `port`.
    fn own_socket_nodelay(port: u16) -> Option<bool> {
        use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
        let inode = ["tcp", "tcp6"].iter().find_map(|t| {
            let text = std::fs::read_to_string(format!("/proc/self/net/{t}")).ok()?;
            text.lines().skip(1).find_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let local = cols.get(1)?.rsplit(':').next()?;
                let inode = cols.get(9)?;
                // A closed connection that used the same ephemeral port may linger in
                // TIME_WAIT, owned by no process (inode 0): not the socket looked for.
                (u16::from_str_radix(local, 16).ok()? == port && *inode != "0")
                    .then(|| inode.to_string())
            })
        })?;
        let pidfd = pidfd_open(getpid(), PidfdFlags::empty()).ok()?;
        std::fs::read_dir("/proc/self/fd")
            .ok()?
            .flatten()
            .find_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                if target.to_string_lossy() != format!("socket:[{inode}]") {
                    return None;
                }
                let fd: i32 = e.file_name().to_string_lossy().parse().ok()?;
                let dup: OwnedFd = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).ok()?;
                rustix::net::sockopt::tcp_nodelay(&dup).ok()
            })
    }

    #[tokio::test]
    async fn the_clients_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, peer) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before a whole request");
                got.extend_from_slice(&buf[..n]);
            }
            let body = br#"{"major":"1","minor":"35","gitVersion":"v1.35.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(body).await.unwrap();
            // Hold the connection open while the test reads the client's socket.
            let nodelay = tokio::task::spawn_blocking(move || own_socket_nodelay(peer.port()))
                .await
                .unwrap();
            drop(s);
            nodelay
        });
        let uri = format!("http://{addr}").parse().unwrap();
        let c = client(Config::new(uri)).unwrap();
        let v = c.apiserver_version().await.unwrap();
        assert_eq!(v.minor, "35");
        assert_eq!(
            server.await.unwrap(),
            Some(true),
            "the client's socket lacks TCP_NODELAY (or was not found)"
        );
    }

    #[tokio::test]
    async fn kube_rs_default_connector_lacks_nodelay_which_is_why_this_module_exists() {
        // The same check against kube-rs's own stack: if a kube-rs release starts setting
        // the option, this fails and the module can go.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let uri = format!("http://{addr}").parse().unwrap();
        let c = Client::try_from(Config::new(uri)).unwrap();
        let call = tokio::spawn(async move { c.apiserver_version().await });
        let (s, peer) = listener.accept().await.unwrap();
        let nodelay = tokio::task::spawn_blocking(move || own_socket_nodelay(peer.port()))
            .await
            .unwrap();
        drop(s);
        call.abort();
        assert_eq!(nodelay, Some(false));
    }
}
