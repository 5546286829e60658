//! The controller in-process on 127.0.0.1:0 with its real gRPC server, shared by the
//! controller's integration tests (each test module uses part of it).
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use tandem_controller::{Config, run};
use tandem_net::auth::{ClusterKey, Identity};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_net::net::{ClientSecurity, ServerSecurity};
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub mod metrics;
pub mod worker;

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Controller {
    pub addr: String,
    /// TLS against the CA this support made (every test runs the controller with TLS).
    pub security: ClientSecurity,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tandem_controller::Error>>,
    pub key: ClusterKey,
}

impl Controller {
    pub async fn start(dir: &Path, tune: impl FnOnce(&mut Config)) -> Controller {
        let mut config = Config::new(dir);
        config.node_timeout = Duration::from_secs(30);
        config.heartbeat_interval = Duration::from_millis(200);
        config.kill_wait = Duration::from_secs(1);
        let (server, security) = tls_for(&dir.join("tls"));
        config.tls = server;
        tune(&mut config);
        let key_file = config.key_file.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(run(config, listener, async {
            let _ = rx.await;
        }));
        // The key is written during start-up; wait for it.
        let key = tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(k) = ClusterKey::load(&key_file) {
                    return k;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
        Controller {
            addr,
            security,
            stop: Some(tx),
            task,
            key,
        }
    }

    pub async fn channel(&self, who: &Identity) -> AuthChannel {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(c) =
                    endpoint::connect_as(&self.addr, &self.security, &self.key, who).await
                {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap()
    }

    pub async fn jobs(&self, who: &Identity) -> JobsClient<AuthChannel> {
        JobsClient::new(self.channel(who).await)
    }

    pub async fn acct(&self, who: &Identity) -> AccountingClient<AuthChannel> {
        AccountingClient::new(self.channel(who).await)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("controller did not stop in time")
            .unwrap()
            .unwrap();
    }
}

/// A cluster CA in `dir` (kept if there is one) and a certificate for 127.0.0.1: the
/// server's and a client's halves.
pub fn tls_for(dir: &Path) -> (ServerSecurity, ClientSecurity) {
    use tandem_net::tls;
    let ca = tls::ca::ClusterCa::load_or_create(&dir.join("ca")).unwrap();
    let srv = dir.join("server");
    ca.write_server_dir(&srv, &["127.0.0.1".into()]).unwrap();
    let server = tls::server_config(&srv.join(tls::CERT_FILE), &srv.join(tls::KEY_FILE)).unwrap();
    let client = tls::client_config(&tls::ca::ClusterCa::cert_path(&dir.join("ca"))).unwrap();
    (ServerSecurity::Tls(server), ClientSecurity::Tls(client))
}

pub fn alice() -> Identity {
    Identity::user("alice", 1000, 1000)
}
