//! What TLS adds to a fresh connection, as the CLI pays it once per call: loading the CA
//! and building the client configuration, then TCP + TLS 1.3 + HTTP/2 to a loopback
//! listener, against the same connect in plain text. Prints JSON (microseconds).
//!
//! `cargo run --release -p tandem-net --example tls_handshake [ROUNDS]`

use std::time::{Duration, Instant};

use tandem_net::net::{self, ClientSecurity, ServerSecurity};
use tandem_net::tls;
use tokio_stream::StreamExt as _;

fn stats(name: &str, mut us: Vec<f64>) -> String {
    us.sort_by(f64::total_cmp);
    let n = us.len();
    let mean = us.iter().sum::<f64>() / n as f64;
    let pct = |p: f64| us[((n as f64 - 1.0) * p).round() as usize];
    format!(
        "\"{name}\": {{\"n\": {n}, \"mean_us\": {mean:.1}, \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}}}",
        pct(0.5),
        pct(0.99),
        us[n - 1]
    )
}

async fn serve(security: ServerSecurity) -> std::net::SocketAddr {
    let l = net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut incoming = l.incoming(security);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(c) = incoming.next().await {
            if let Ok(c) = c {
                // Answer the HTTP/2 preface with a SETTINGS frame, as a server does.
                let mut c = c;
                use tokio::io::AsyncWriteExt as _;
                let _ = c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
                held.push(c);
            }
        }
    });
    addr
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let ca = tls::ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
    let srv = dir.path().join("srv");
    ca.write_server_dir(&srv, &["127.0.0.1".into()]).unwrap();
    let server = tls::server_config(&srv.join(tls::CERT_FILE), &srv.join(tls::KEY_FILE)).unwrap();
    let ca_file = tls::ca::ClusterCa::cert_path(&dir.path().join("ca"));

    let tls_addr = serve(ServerSecurity::Tls(server)).await;
    let plain_addr = serve(ServerSecurity::Plaintext).await;
    let (mut load, mut tls_connect, mut plain_connect) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        let client = ClientSecurity::Tls(tls::client_config(&ca_file).unwrap());
        load.push(t.elapsed().as_secs_f64() * 1e6);
        for (addr, security, out) in [
            (tls_addr, &client, &mut tls_connect),
            (plain_addr, &ClientSecurity::Plaintext, &mut plain_connect),
        ] {
            let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(5));
            let t = Instant::now();
            let ch = net::connect(&ep, security).await.unwrap();
            out.push(t.elapsed().as_secs_f64() * 1e6);
            drop(ch);
        }
    }
    let tls_mean = tls_connect.iter().sum::<f64>() / rounds as f64;
    let plain_mean = plain_connect.iter().sum::<f64>() / rounds as f64;
    let load_mean = load.iter().sum::<f64>() / rounds as f64;
    println!(
        "{{{}, {}, {}, \"tls_over_plain_us\": {:.1}, \"tls_total_extra_us\": {:.1}}}",
        stats("load_ca_and_config", load),
        stats("connect_tls", tls_connect),
        stats("connect_plain", plain_connect),
        tls_mean - plain_mean,
        tls_mean - plain_mean + load_mean
    );
}
