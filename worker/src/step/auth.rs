//! Who may launch or signal step tasks on this node.
//!
//! Every request passed the credential interceptor, so the caller holds a valid credential
//! of this cluster. On top of that:
//!
//! - `LaunchTasks` needs the step's launch credential, signed by the controller in
//!   `CreateStep` (as Slurm's job credential): it names the job, the step, the step's nodes
//!   and the job's uid/gid, and expires shortly. A missing, expired or foreign one (another
//!   job, step, user, or a node not in the step) is refused, whoever the caller is, so a
//!   user cannot start tasks outside an allocation the controller granted.
//! - A `user` caller may launch tasks only as itself (`uid` and `gid` of the request equal its
//!   credential's) and signal only steps whose tasks it owns. `worker` and `admin` callers
//!   (root, daemons) may act for any user.

use tandem_net::auth::{ClusterKey, Identity, Role, TokenError};

/// Why a step request was refused (becomes `PERMISSION_DENIED`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("user {user} (uid {uid}) may launch tasks only as itself, not as uid {want_uid}")]
    OtherUser {
        user: String,
        uid: u32,
        want_uid: u32,
    },
    #[error("user {user} may launch tasks only with its own gid {gid}, not {want_gid}")]
    OtherGroup {
        user: String,
        gid: u32,
        want_gid: u32,
    },
    #[error(
        "no launch credential for step {job_id}.{step_id}: steps run only inside an allocation (srun gets one from the controller)"
    )]
    MissingLaunchCredential { job_id: u64, step_id: u32 },
    #[error("launch credential for step {job_id}.{step_id} is invalid: {why}")]
    BadLaunchToken {
        job_id: u64,
        step_id: u32,
        why: String,
    },
    #[error(
        "launch credential is for another step, user or node, not step {job_id}.{step_id} of uid {uid} on {node}"
    )]
    ForeignLaunchToken {
        job_id: u64,
        step_id: u32,
        uid: u32,
        node: String,
    },
    #[error("step {job_id}.{step_id} on this node belongs to uid {owner}")]
    NotOwner {
        job_id: u64,
        step_id: u32,
        owner: u32,
    },
}

/// What a `LaunchTasks` request asks for.
#[derive(Debug, Clone, Copy)]
pub struct LaunchAsk<'a> {
    pub node: &'a str,
    pub job_id: u64,
    pub step_id: u32,
    pub uid: u32,
    pub gid: u32,
    pub launch_token: &'a str,
}

/// Checks a `LaunchTasks` request at time `now`.
pub fn authorize_launch(
    caller: &Identity,
    key: &ClusterKey,
    ask: &LaunchAsk<'_>,
    now: i64,
) -> Result<(), Denied> {
    let (job_id, step_id) = (ask.job_id, ask.step_id);
    if ask.launch_token.is_empty() {
        return Err(Denied::MissingLaunchCredential { job_id, step_id });
    }
    let grant = key
        .verify_step(ask.launch_token, now)
        .map_err(|e: TokenError| Denied::BadLaunchToken {
            job_id,
            step_id,
            why: e.to_string(),
        })?;
    if grant.job_id != job_id
        || grant.step_id != step_id
        || grant.uid != ask.uid
        || grant.gid != ask.gid
        || !grant.nodes.iter().any(|n| n == ask.node)
    {
        return Err(Denied::ForeignLaunchToken {
            job_id,
            step_id,
            uid: ask.uid,
            node: ask.node.to_owned(),
        });
    }
    if caller.role != Role::User {
        return Ok(());
    }
    if caller.uid != ask.uid {
        return Err(Denied::OtherUser {
            user: caller.user.clone(),
            uid: caller.uid,
            want_uid: ask.uid,
        });
    }
    if caller.gid != ask.gid {
        return Err(Denied::OtherGroup {
            user: caller.user.clone(),
            gid: caller.gid,
            want_gid: ask.gid,
        });
    }
    Ok(())
}

/// Checks a `SignalTasks` request against the owner of the step's tasks here.
pub fn authorize_signal(
    caller: &Identity,
    job_id: u64,
    step_id: u32,
    owner: u32,
) -> Result<(), Denied> {
    if caller.role != Role::User || caller.uid == owner {
        Ok(())
    } else {
        Err(Denied::NotOwner {
            job_id,
            step_id,
            owner,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_net::auth::{KEY_LEN, StepGrant};

    fn key() -> ClusterKey {
        ClusterKey::from_bytes([9; KEY_LEN])
    }

    fn alice() -> Identity {
        Identity::user("alice", 1000, 100)
    }

    fn grant(job: u64, step: u32, uid: u32, nodes: &[&str]) -> StepGrant {
        StepGrant {
            job_id: job,
            step_id: step,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            uid,
            gid: 100,
            exp: 0,
        }
    }

    fn ask<'a>(token: &'a str, uid: u32, gid: u32) -> LaunchAsk<'a> {
        LaunchAsk {
            node: "n1",
            job_id: 5,
            step_id: 1,
            uid,
            gid,
            launch_token: token,
        }
    }

    const NOW: i64 = 10_000;

    #[test]
    fn a_launch_credential_is_required() {
        for caller in [
            alice(),
            Identity::user("root", 0, 0),
            Identity::worker("n1", 0, 0),
        ] {
            assert!(matches!(
                authorize_launch(&caller, &key(), &ask("", 1000, 100), NOW),
                Err(Denied::MissingLaunchCredential { .. })
            ));
        }
    }

    #[test]
    fn users_launch_only_as_themselves() {
        let k = key();
        let good = k.issue_step(&grant(5, 1, 1000, &["n1"]), NOW, 60);
        assert_eq!(
            authorize_launch(&alice(), &k, &ask(&good, 1000, 100), NOW),
            Ok(())
        );
        let as_root = k.issue_step(&grant(5, 1, 0, &["n1"]), NOW, 60);
        assert!(matches!(
            authorize_launch(&alice(), &k, &ask(&as_root, 0, 100), NOW),
            Err(Denied::OtherUser { want_uid: 0, .. })
        ));
        let mut g = grant(5, 1, 1000, &["n1"]);
        g.gid = 0;
        let other_gid = k.issue_step(&g, NOW, 60);
        assert!(matches!(
            authorize_launch(&alice(), &k, &ask(&other_gid, 1000, 0), NOW),
            Err(Denied::OtherGroup { .. })
        ));
    }

    #[test]
    fn daemons_and_root_act_for_any_user_with_a_grant() {
        let k = key();
        let good = k.issue_step(&grant(5, 1, 1000, &["n1"]), NOW, 60);
        for caller in [Identity::user("root", 0, 0), Identity::worker("n1", 0, 0)] {
            assert_eq!(
                authorize_launch(&caller, &k, &ask(&good, 1000, 100), NOW),
                Ok(())
            );
            assert_eq!(authorize_signal(&caller, 1, 0, 1000), Ok(()));
        }
    }

    #[test]
    fn foreign_expired_and_forged_grants_are_refused() {
        let k = key();
        for foreign in [
            grant(5, 2, 1000, &["n1"]),
            grant(6, 1, 1000, &["n1"]),
            grant(5, 1, 1001, &["n1"]),
            grant(5, 1, 1000, &["n2", "n3"]),
        ] {
            let t = k.issue_step(&foreign, NOW, 60);
            assert!(matches!(
                authorize_launch(&alice(), &k, &ask(&t, 1000, 100), NOW),
                Err(Denied::ForeignLaunchToken { .. })
            ));
        }
        let expired = k.issue_step(&grant(5, 1, 1000, &["n1"]), NOW - 120, 60);
        let e = authorize_launch(&alice(), &k, &ask(&expired, 1000, 100), NOW).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
        let forged =
            ClusterKey::from_bytes([1; KEY_LEN]).issue_step(&grant(5, 1, 1000, &["n1"]), NOW, 60);
        assert!(matches!(
            authorize_launch(&alice(), &k, &ask(&forged, 1000, 100), NOW),
            Err(Denied::BadLaunchToken { .. })
        ));
        // An identity credential is not a launch credential.
        let ident = k.sign(&alice(), NOW);
        assert!(matches!(
            authorize_launch(&alice(), &k, &ask(&ident, 1000, 100), NOW),
            Err(Denied::BadLaunchToken { .. })
        ));
    }

    #[test]
    fn users_signal_only_their_steps() {
        assert_eq!(authorize_signal(&alice(), 1, 0, 1000), Ok(()));
        assert!(matches!(
            authorize_signal(&alice(), 1, 0, 1001),
            Err(Denied::NotOwner { owner: 1001, .. })
        ));
    }
}
