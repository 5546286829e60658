//! `tandem authd`: the local identity agent (as munged or Slurm's sackd).
//!
//! Holds the cluster key (refusing one that group or others may read), listens on a Unix
//! socket any local user may connect to (mode 0666), learns each caller's uid and gid from
//! the kernel (`SO_PEERCRED`) and answers with a short-lived credential for exactly that
//! uid, signed with the key. Users never read the key; a caller cannot name the uid it
//! wants. Protocol: `tandem_net::auth::agent`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tandem_net::auth::{ClusterKey, agent, unix_now};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

use crate::Exit;

/// How long a caller may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Run the identity agent: issue credentials to local users on a Unix socket.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Cluster key file (mode 0600, readable only by this agent's user).
    #[arg(long, env = "TANDEM_KEY_FILE", required_unless_present = "check")]
    pub key_file: Option<PathBuf>,
    /// Socket to listen on. Default: authd.sock beside the key file (the cluster's state dir).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Do not serve: ask the running agent (the cluster file's, or --socket) for a credential
    /// and print whom it names, as `munge -n | unmunge` does.
    #[arg(long)]
    pub check: bool,
}

/// The default socket of a key file: `DIR/authd.sock`.
pub fn default_socket(key_file: &std::path::Path) -> PathBuf {
    key_file
        .parent()
        .unwrap_or_else(|| std::path::Path::new("."))
        .join("authd.sock")
}

pub async fn run(args: Args) -> Exit {
    if args.check {
        return check(&args);
    }
    crate::init_tracing();
    let Some(key_file) = args.key_file.clone() else {
        bail!("--key-file is required");
    };
    let key = ClusterKey::load(&key_file)
        .with_context(|| format!("cannot load the cluster key {}", key_file.display()))?;
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| default_socket(&key_file));
    let listener = bind(&socket)?;
    tracing::info!(socket = %socket.display(), "identity agent listening");
    let key = Arc::new(key);
    let host = crate::client::hostname();
    let shutdown = crate::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let key = Arc::clone(&key);
                    let host = host.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve(stream, &key, &host).await {
                            tracing::debug!(error = %e, "identity request failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("identity agent stopped");
    Ok(0)
}

/// `--check`: one request to the agent; prints the identity it vouched for as JSON.
fn check(args: &Args) -> Exit {
    let socket = match &args.socket {
        Some(s) => s.clone(),
        None => tandem_net::endpoint::discover()?
            .auth_socket
            .context("the cluster file names no identity agent; pass --socket")?,
    };
    let issued = agent::request(&socket)?;
    let out = serde_json::json!({
        "user": issued.identity.user,
        "uid": issued.identity.uid,
        "gid": issued.identity.gid,
        "role": format!("{:?}", issued.identity.role).to_lowercase(),
        "expires": issued.exp,
        "socket": socket,
    });
    println!("{out}");
    Ok(0)
}

/// Binds the socket, replacing a stale one (never a regular file nor a live socket), and
/// opens it to all local users: the kernel, not the file mode, says who each caller is.
fn bind(socket: &std::path::Path) -> anyhow::Result<UnixListener> {
    let listener = tandem_net::net::bind_unix_std(socket)?;
    listener.set_nonblocking(true)?;
    Ok(UnixListener::from_std(listener)?)
}

async fn serve(mut stream: UnixStream, key: &ClusterKey, host: &str) -> anyhow::Result<()> {
    let cred = stream.peer_cred().context("no peer credentials")?;
    let (uid, gid) = (cred.uid(), cred.gid());
    let mut buf = [0u8; 64];
    let mut got = 0;
    // Read the request line (a few bytes); a caller that sends nothing gets nothing.
    while got < agent::REQUEST.len() {
        let n = tokio::time::timeout(READ_TIMEOUT, stream.read(&mut buf[got..]))
            .await
            .context("request timed out")??;
        if n == 0 {
            break;
        }
        got += n;
    }
    let reply = if &buf[..got] == agent::REQUEST {
        let user = tandem_net::net::user_name_of(uid);
        agent::reply_for(key, &user, uid, gid, host, unix_now())
    } else {
        agent::Reply {
            v: 1,
            token: String::new(),
            exp: 0,
            user: String::new(),
            uid: 0,
            gid: 0,
            error: "unknown request (expected TANDEM-AUTH 1)".into(),
        }
    };
    let mut out = serde_json::to_vec(&reply)?;
    out.push(b'\n');
    stream.write_all(&out).await?;
    stream.shutdown().await?;
    Ok(())
}
