//! Who may do what. Pure functions over the verified [`Identity`], so every rule has a test
//! and handlers only ask.
//!
//! Slurm's rules, kept: a user controls only their own jobs; an operator (admin) controls
//! any; a user may lower but not raise a time limit, and may not set an absolute priority or
//! release an operator's hold; nodes are changed only by operators.

use tandem_proto::auth::{Identity, Role};

/// Cancel, hold, release, requeue, signal, update: the owner or an admin.
pub fn may_control_job(who: &Identity, owner_uid: u32) -> bool {
    who.is_admin() || (who.role == Role::User && who.uid == owner_uid)
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

/// Drain, resume, down: operators only.
pub fn may_update_node(who: &Identity) -> bool {
    who.is_admin()
}

/// Accounts, users and QOS (sacctmgr add/modify/delete): operators only, as Slurm's
/// AdminLevel=Operator. Reading them (show, sshare, sprio) is open to every user.
pub fn may_change_accounting(who: &Identity) -> bool {
    who.is_admin()
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
        assert!(!may_change_accounting(&alice()) && may_change_accounting(&root()));
        assert!(!may_change_accounting(&worker()));
        assert!(!may_set_priority(&alice()) && may_set_priority(&root()));
        assert!(may_connect_worker(&worker()) && may_connect_worker(&root()));
        assert!(!may_connect_worker(&alice()));
        assert!(may_run_step(&alice(), 1000) && !may_run_step(&bob(), 1000));
    }
}
