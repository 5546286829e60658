//! Finding the cluster and talking to it as the current user.

use std::sync::OnceLock;

use tandem_net::auth::{ClientAuth, Identity};
use tandem_net::endpoint::{self, AuthChannel, Endpoint, MAX_RESPONSE_BYTES};
use tandem_net::net::{self, ClientSecurity};
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;
use tonic::service::interceptor::InterceptedService;

/// Clients of the controller's services, sharing one authenticated channel.
#[derive(Debug, Clone)]
pub struct Client {
    pub jobs: JobsClient<AuthChannel>,
    pub nodes: NodesClient<AuthChannel>,
    pub accounting: AccountingClient<AuthChannel>,
    /// Whom the controller knows this process as: the agent's word when it issued a
    /// credential; on the local socket (where the controller reads the caller from the
    /// kernel) the process's own uid, gid and name, looked up only when a command asks
    /// ([`Client::identity`]): the password-database lookup was a twentieth of an
    /// `sbatch`, which never needs it.
    identity: OnceLock<Identity>,
    pub cluster_name: String,
    pub controller: String,
    endpoint: Endpoint,
    /// The credential and TLS set-up of a TCP connection, kept for srun's connections to
    /// the workers; on the local socket neither was needed, so [`Client::worker_access`]
    /// makes them when srun asks.
    access: Option<(ClientAuth, ClientSecurity)>,
}

impl Client {
    /// Discovers the cluster (`$TANDEM_CONFIG`, `~/.tandem/cluster.json`, ...) and connects:
    /// to the controller's local socket when the cluster file names one that answers (no
    /// TCP, TLS or credential: the kernel names the caller), else to its address with a
    /// credential (from the identity agent, or signed with the key if this user can read
    /// it: one round trip either way).
    pub async fn connect() -> anyhow::Result<Client> {
        let ep = endpoint::discover()?;
        crate::timing::mark("discovered");
        if let Some(socket) = ep.local_socket.as_deref() {
            match net::connect_local(socket).await {
                Ok(channel) => {
                    crate::timing::mark("connected");
                    // Nothing of it is sent on this socket: the name stays unresolved.
                    let uid = nix::unistd::getuid().as_raw();
                    let gid = nix::unistd::getgid().as_raw();
                    let auth = ClientAuth::unattached(Identity::user(String::new(), uid, gid));
                    return Ok(Client::over(
                        InterceptedService::new(channel, auth),
                        OnceLock::new(),
                        ep,
                        None,
                    ));
                }
                // Another host, or a controller that stopped: the address still serves.
                Err(e) => {
                    tracing::debug!(socket = %socket.display(), error = %e, "local socket unusable")
                }
            }
        }
        let auth = ep.client_auth(&current_identity())?;
        crate::timing::mark("credential");
        let identity = OnceLock::from(auth.identity().clone());
        let security = ep.security()?;
        let channel = endpoint::connect_with(&ep.controller, &security, auth.clone()).await?;
        crate::timing::mark("connected");
        Ok(Client::over(channel, identity, ep, Some((auth, security))))
    }

    fn over(
        channel: AuthChannel,
        identity: OnceLock<Identity>,
        endpoint: Endpoint,
        access: Option<(ClientAuth, ClientSecurity)>,
    ) -> Client {
        Client {
            jobs: JobsClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES),
            nodes: NodesClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES),
            accounting: AccountingClient::new(channel)
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            identity,
            cluster_name: endpoint.cluster_name.clone(),
            controller: endpoint.controller.clone(),
            endpoint,
            access,
        }
    }

    /// Whom the controller knows this process as (see the field).
    pub fn identity(&self) -> &Identity {
        self.identity.get_or_init(current_identity)
    }

    /// The credential and TLS set-up for the workers' step services (srun): the ones the
    /// controller connection used, or, after the local socket, fresh ones (made once).
    pub fn worker_access(&mut self) -> anyhow::Result<(ClientAuth, ClientSecurity)> {
        if let Some(access) = &self.access {
            return Ok(access.clone());
        }
        let access = (
            self.endpoint.client_auth(self.identity())?,
            self.endpoint.security()?,
        );
        self.access = Some(access.clone());
        Ok(access)
    }
}

/// The identity of the process: its uid, gid and user name.
pub fn current_identity() -> Identity {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    Identity::user(user_name(), uid.as_raw(), gid.as_raw())
}

/// The current user's name, from the password database, else `$USER`, else the uid.
pub fn user_name() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| uid.as_raw().to_string())
}

/// This process's file-creation mask. umask(2) only reads it by setting it: set and set
/// back while no other thread of this command creates files (it has none yet).
pub fn umask() -> u32 {
    use nix::sys::stat::{Mode, umask};
    let mask = umask(Mode::from_bits_truncate(0o022));
    umask(mask);
    mask.bits()
}

/// This machine's host name (SLURM_SUBMIT_HOST).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Turns a gRPC status into an error whose message is the controller's own words.
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    match s.code() {
        Code::Unavailable => anyhow::anyhow!("controller unavailable: {}", s.message()),
        Code::Unauthenticated => anyhow::anyhow!("authentication failed: {}", s.message()),
        // tonic's own deadline ([`endpoint::message_timeout`]), not the server's words.
        Code::Cancelled if s.message() == tonic::TimeoutExpired(()).to_string() => anyhow::anyhow!(
            "the controller did not answer within {} s ({} sets how long to wait)",
            endpoint::message_timeout().as_secs(),
            endpoint::ENV_MSG_TIMEOUT
        ),
        _ => anyhow::anyhow!("{}", s.message()),
    }
}

/// Attaches the gRPC status of a failed call as a one-line error.
pub trait RpcResult<T> {
    fn rpc(self) -> anyhow::Result<T>;
}

impl<T> RpcResult<T> for Result<tonic::Response<T>, tonic::Status> {
    fn rpc(self) -> anyhow::Result<T> {
        self.map(tonic::Response::into_inner).map_err(status_error)
    }
}

/// Reads a file, naming it in the error in Slurm's words (`Unable to open file job.sh`,
/// without the system's reason, as sbatch prints it).
pub fn read_file(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|_| anyhow::anyhow!("Unable to open file {}", path.display()))
}
