//! Who may do what. Pure functions over the verified [`Identity`], so every rule has a test
//! and handlers only ask.
//!
//! Two layers:
//!
//! - [`allowed`]: the one table of which role may call which RPC. Every handler starts with
//!   [`require`], so a role never reaches a handler it has no business in (a worker cannot
//!   submit, a user cannot attach as a node, nobody but an admin changes accounting).
//! - Object rules (`may_*`), asked by handlers and the state actor once the object is known.
//!
//! Slurm's rules, kept: a user controls only their own jobs; an operator (admin) controls
//! any; a user may lower but not raise a time limit, and may not set an absolute priority or
//! release an operator's hold; nodes are changed only by operators.

use tandem_net::auth::{Identity, Role, identity};
use tonic::{Request, Status};

/// Every RPC the controller serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rpc {
    Submit,
    Cancel,
    ListJobs,
    UpdateJob,
    WatchJob,
    CreateStep,
    CompleteStep,
    ListNodes,
    ListPartitions,
    UpdateNode,
    /// Removing a node from the controller (worker-set scale-in and deletion).
    RemoveNode,
    ClusterInfo,
    WorkerAttach,
    ListJobRecords,
    /// sacctmgr add/modify/delete of accounts, users and QOS.
    AccountingChange,
    ListAssociations,
    ListQos,
    ListShares,
    ListPriorities,
    /// The bridge's placeholder jobs: submit, end, watch (`tandem.v1.Bridge`).
    Placeholders,
}

/// The table: may `role` call `rpc` at all? (Which objects it may touch is decided later.)
pub fn allowed(rpc: Rpc, role: Role) -> bool {
    use Role::{Admin, Bridge, Operator, User, Worker};
    use Rpc::*;
    match rpc {
        // Batch jobs: users own them; admins act on any. The bridge has its own service.
        Submit | Cancel | UpdateJob | WatchJob => matches!(role, User | Admin),
        // Steps run inside allocations, as the job's user (srun).
        CreateStep | CompleteStep => matches!(role, User | Admin),
        // Reads: everyone but node agents, which have their own stream.
        ListJobs | ListNodes | ListPartitions | ListJobRecords | ListAssociations | ListQos
        | ListShares | ListPriorities => matches!(role, User | Admin | Bridge | Operator),
        ClusterInfo => true,
        // Drain/resume: admins and the operator (scale-in drains before deleting pods); the
        // bridge drains a node whose GPU holder was refused ([`may_drain_node`]).
        UpdateNode => matches!(role, Admin | Operator | Bridge),
        RemoveNode => matches!(role, Admin | Operator),
        WorkerAttach => matches!(role, Worker | Admin),
        // The operator reconciles the accounts, users and QOS its TandemCluster declares.
        AccountingChange => matches!(role, Admin | Operator),
        // Placeholder jobs hold nodes for pods: only the bridge (and admins) make them.
        Placeholders => matches!(role, Admin | Bridge),
    }
}

/// The caller's identity if its role may call `rpc`; `PERMISSION_DENIED` otherwise.
#[allow(clippy::result_large_err)]
pub fn require<T>(request: &Request<T>, rpc: Rpc) -> Result<Identity, Status> {
    let who = identity(request)?;
    if allowed(rpc, who.role) {
        Ok(who.clone())
    } else {
        let hint = match rpc {
            Rpc::AccountingChange | Rpc::UpdateNode | Rpc::RemoveNode => {
                "; only operators (configured administrators) and root may"
            }
            _ => "",
        };
        Err(Status::permission_denied(format!(
            "{} ({:?} credential) may not call {rpc:?}{hint}",
            who.user, who.role
        )))
    }
}

/// A worker speaks only for the node its credential names; an admin (tools, tests) for any.
pub fn may_register_as(who: &Identity, node: &str) -> bool {
    who.is_admin() || who.node() == Some(node)
}

/// Lifetime of a step launch credential: srun uses it right after CreateStep.
pub const STEP_GRANT_LIFETIME: i64 = 300;

/// A worker's `JobStarted`: only from the job's batch host, and it may only refine the start
/// the controller recorded (the fork comes a little after the allocation), never move it
/// back in time or far ahead (which would stretch the time limit).
pub fn may_report_start(
    batch_host: Option<&str>,
    node: &str,
    current: Option<i64>,
    reported: i64,
    now: i64,
) -> bool {
    const LAUNCH_SLACK: i64 = 120;
    if batch_host != Some(node) {
        return false;
    }
    match current {
        Some(c) => {
            reported <= 0 || (reported >= c - 5 && reported <= (c + LAUNCH_SLACK).min(now + 5))
        }
        None => reported <= now + 5,
    }
}

/// Job details beyond its state (command, working directory, output paths, submit host):
/// the owner and admins only, as Slurm's PrivateData=jobs would.
pub fn may_read_job_details(who: &Identity, owner_uid: u32) -> bool {
    who.is_admin() || who.uid == owner_uid && matches!(who.role, Role::User | Role::Bridge)
}

/// Cancel, hold, release, requeue, signal, update: the owner or an admin.
pub fn may_control_job(who: &Identity, owner_uid: u32) -> bool {
    who.is_admin() || (matches!(who.role, Role::User | Role::Bridge) && who.uid == owner_uid)
}

/// Release a hold: an admin hold only by an admin.
pub fn may_release(who: &Identity, owner_uid: u32, admin_hold: bool) -> bool {
    if admin_hold {
        who.is_admin()
    } else {
        may_control_job(who, owner_uid)
    }
}

/// Change a time limit: owners may only shorten it.
pub fn may_set_time_limit(
    who: &Identity,
    owner_uid: u32,
    current: Option<u64>,
    new: Option<u64>,
) -> bool {
    if who.is_admin() {
        return true;
    }
    if !may_control_job(who, owner_uid) {
        return false;
    }
    match (current, new) {
        (_, None) => current.is_none(),
        (None, Some(_)) => true,
        (Some(c), Some(n)) => n <= c,
    }
}

/// Absolute priorities are an operator's tool.
pub fn may_set_priority(who: &Identity) -> bool {
    who.is_admin()
}

/// Drain, resume, down: admins and the Kubernetes operator.
pub fn may_update_node(who: &Identity) -> bool {
    who.is_admin() || who.role == Role::Operator
}

/// Drain only: also the bridge, which drains a batch node where something other than its
/// GPU holder holds GPUs. Resuming stays an operator's decision.
pub fn may_drain_node(who: &Identity) -> bool {
    may_update_node(who) || who.role == Role::Bridge
}

/// Accounts, users and QOS (sacctmgr add/modify/delete): operators only, as Slurm's
/// AdminLevel=Operator. Reading them (show, sshare, sprio) is open to every user.
pub fn may_change_accounting(who: &Identity) -> bool {
    who.is_admin() || who.role == Role::Operator
}

/// The WorkerLink stream is for node agents (and admins, for tests and tools).
pub fn may_connect_worker(who: &Identity) -> bool {
    matches!(who.role, Role::Worker | Role::Admin)
}

/// Steps inside an allocation: the job's owner (srun runs as them) or an admin.
pub fn may_run_step(who: &Identity, owner_uid: u32) -> bool {
    may_control_job(who, owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }
    fn bob() -> Identity {
        Identity::user("bob", 1001, 1001)
    }
    fn root() -> Identity {
        Identity::user("root", 0, 0)
    }
    fn worker() -> Identity {
        Identity::worker("n1", 1000, 1000)
    }

    #[test]
    fn the_rpc_table() {
        use Role::*;
        use Rpc::*;
        let all = [User, Worker, Admin, Bridge, Operator];
        let cases: &[(Rpc, &[Role])] = &[
            (Submit, &[User, Admin]),
            (Cancel, &[User, Admin]),
            (UpdateJob, &[User, Admin]),
            (WatchJob, &[User, Admin]),
            (CreateStep, &[User, Admin]),
            (CompleteStep, &[User, Admin]),
            (ListJobs, &[User, Admin, Bridge, Operator]),
            (ListNodes, &[User, Admin, Bridge, Operator]),
            (ListJobRecords, &[User, Admin, Bridge, Operator]),
            (ClusterInfo, &[User, Worker, Admin, Bridge, Operator]),
            (UpdateNode, &[Admin, Operator, Bridge]),
            (WorkerAttach, &[Worker, Admin]),
            (AccountingChange, &[Admin, Operator]),
            (RemoveNode, &[Admin, Operator]),
            (Placeholders, &[Admin, Bridge]),
        ];
        for (rpc, ok) in cases {
            for role in all {
                assert_eq!(allowed(*rpc, role), ok.contains(&role), "{rpc:?} {role:?}");
            }
        }
    }

    #[test]
    fn require_reads_the_verified_identity() {
        let mut req = Request::new(());
        assert_eq!(
            require(&req, Rpc::Submit).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        req.extensions_mut().insert(worker());
        let e = require(&req, Rpc::Submit).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(require(&req, Rpc::WorkerAttach).is_ok());
    }

    #[test]
    fn workers_speak_only_for_their_node() {
        assert!(may_register_as(&worker(), "n1"));
        assert!(!may_register_as(&worker(), "n2"));
        assert!(!may_register_as(&alice(), "alice"));
        assert!(may_register_as(&root(), "n2"));
    }

    #[test]
    fn start_reports_come_from_the_batch_host_and_stay_near_the_allocation() {
        assert!(may_report_start(Some("n1"), "n1", Some(100), 101, 200));
        assert!(!may_report_start(Some("n1"), "n2", Some(100), 101, 200));
        assert!(!may_report_start(None, "n1", Some(100), 101, 200));
        // Back in time, or far ahead: a rewrite, not a refinement.
        assert!(!may_report_start(Some("n1"), "n1", Some(100), 50, 200));
        assert!(!may_report_start(Some("n1"), "n1", Some(100), 1_000, 2_000));
        assert!(!may_report_start(Some("n1"), "n1", Some(100), 150, 120));
    }

    #[test]
    fn job_details_are_private() {
        assert!(may_read_job_details(&alice(), 1000));
        assert!(!may_read_job_details(&bob(), 1000));
        assert!(may_read_job_details(&root(), 1000));
        assert!(!may_read_job_details(&worker(), 1000));
    }

    #[test]
    fn owners_and_admins_control_jobs() {
        assert!(may_control_job(&alice(), 1000));
        assert!(!may_control_job(&bob(), 1000));
        assert!(may_control_job(&root(), 1000));
        // A worker identity that happens to share the uid is not the user.
        assert!(!may_control_job(&worker(), 1000));
    }

    #[test]
    fn admin_holds_need_an_admin() {
        assert!(may_release(&alice(), 1000, false));
        assert!(!may_release(&alice(), 1000, true));
        assert!(may_release(&root(), 1000, true));
    }

    #[test]
    fn users_only_shorten_time_limits() {
        let cases = [
            // (who, current, new, want)
            (alice(), Some(60), Some(30), true),
            (alice(), Some(60), Some(120), false),
            (alice(), Some(60), None, false),
            (alice(), None, Some(60), true),
            (alice(), None, None, true),
            (bob(), Some(60), Some(30), false),
            (root(), Some(60), None, true),
        ];
        for (who, cur, new, want) in cases {
            assert_eq!(
                may_set_time_limit(&who, 1000, cur, new),
                want,
                "{} {cur:?}->{new:?}",
                who.user
            );
        }
    }

    #[test]
    fn nodes_priorities_and_worker_links() {
        assert!(!may_update_node(&alice()) && may_update_node(&root()));
        let op = Identity::service(Role::Operator, "tandem-operator", 0, 0);
        assert!(may_update_node(&op) && !may_control_job(&op, 0));
        // The bridge drains (a refused GPU holder) and does nothing else to nodes.
        let bridge = Identity::service(Role::Bridge, "tandem-bridge", 0, 0);
        assert!(may_drain_node(&bridge) && !may_update_node(&bridge));
        assert!(!may_drain_node(&alice()) && may_drain_node(&op) && may_drain_node(&root()));
        assert!(!may_change_accounting(&alice()) && may_change_accounting(&root()));
        assert!(!may_change_accounting(&worker()) && may_change_accounting(&op));
        assert!(!may_set_priority(&alice()) && may_set_priority(&root()));
        assert!(may_connect_worker(&worker()) && may_connect_worker(&root()));
        assert!(!may_connect_worker(&alice()));
        assert!(may_run_step(&alice(), 1000) && !may_run_step(&bob(), 1000));
    }
}
