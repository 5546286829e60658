//! Finding the cluster and talking to it as the current user.

use anyhow::Context as _;
use tandem_proto::auth::{ClientAuth, Identity};
use tandem_proto::endpoint::{self, AuthChannel, MAX_RESPONSE_BYTES};
use tandem_proto::net::ClientSecurity;
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;

/// Clients of the controller's services, sharing one authenticated channel.
#[derive(Debug, Clone)]
pub struct Client {
    pub jobs: JobsClient<AuthChannel>,
    pub nodes: NodesClient<AuthChannel>,
    pub accounting: AccountingClient<AuthChannel>,
    /// Whom the credentials name (the agent's word when it issued them).
    pub identity: Identity,
    /// The credentials, shared with connections to workers (srun).
    pub auth: ClientAuth,
    /// TLS against the cluster CA (loaded once per process), shared with srun's connections
    /// to the workers' step services.
    pub security: ClientSecurity,
    pub cluster_name: String,
    pub controller: String,
}

impl Client {
    /// Discovers the cluster (`$TANDEM_CONFIG`, `~/.tandem/cluster.json`, ...), gets a
    /// credential (from the identity agent, or signed with the key if this user can read
    /// it: one round trip either way) and connects.
    pub async fn connect() -> anyhow::Result<Client> {
        let ep = endpoint::discover()?;
        crate::timing::mark("discovered");
        let auth = ep.client_auth(&current_identity())?;
        crate::timing::mark("credential");
        let identity = auth.identity().clone();
        let security = ep.security()?;
        let channel = endpoint::connect_with(&ep.controller, &security, auth.clone()).await?;
        crate::timing::mark("connected");
        Ok(Client {
            jobs: JobsClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES),
            nodes: NodesClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES),
            accounting: AccountingClient::new(channel)
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            identity,
            auth,
            security,
            cluster_name: ep.cluster_name,
            controller: ep.controller,
        })
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

/// Reads a file, naming it in the error.
pub fn read_file(path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("Unable to open file {}", path.display()))
}
