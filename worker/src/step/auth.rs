//! Who may launch or signal step tasks on this node.
//!
//! Every request passed the cluster-token interceptor, so the caller holds a token signed
//! with the cluster key. On top of that:
//!
//! - A `user` identity may launch tasks only as itself (`uid` and `gid` of the request equal
//!   the token's) and signal only steps whose tasks it owns. `worker` and `admin` identities
//!   (root, other daemons) may act for any user.
//! - A non-empty `launch_token` must be a cluster-signed token whose subject is
//!   `step:<job_id>.<step_id>` and whose uid/gid match the request: the controller mints it in
//!   `CreateStep`, which proves the step exists in a running job of that user. An empty
//!   `launch_token` is accepted on the identity checks alone, until the controller mints them.
//!
//! Holding the cluster key lets a process sign any identity (see `tandem_proto::auth`), so
//! these checks stop mistakes and users without the key, not key holders.

use tandem_proto::auth::{ClusterKey, Identity, Role};

/// Subject a step's `launch_token` is signed for.
pub fn launch_token_subject(job_id: u64, step_id: u32) -> String {
    format!("step:{job_id}.{step_id}")
}

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
    #[error("launch token is not valid for step {job_id}.{step_id} of uid {uid}")]
    BadLaunchToken { job_id: u64, step_id: u32, uid: u32 },
    #[error("step {job_id}.{step_id} on this node belongs to uid {owner}")]
    NotOwner {
        job_id: u64,
        step_id: u32,
        owner: u32,
    },
}

/// Checks a `LaunchTasks` request.
pub fn authorize_launch(
    caller: &Identity,
    key: &ClusterKey,
    job_id: u64,
    step_id: u32,
    uid: u32,
    gid: u32,
    launch_token: &str,
) -> Result<(), Denied> {
    if !launch_token.is_empty() {
        let bad = || Denied::BadLaunchToken {
            job_id,
            step_id,
            uid,
        };
        let t = key.verify(launch_token).map_err(|_| bad())?;
        if t.user != launch_token_subject(job_id, step_id) || t.uid != uid || t.gid != gid {
            return Err(bad());
        }
    }
    if caller.role != Role::User {
        return Ok(());
    }
    if caller.uid != uid {
        return Err(Denied::OtherUser {
            user: caller.user.clone(),
            uid: caller.uid,
            want_uid: uid,
        });
    }
    if caller.gid != gid {
        return Err(Denied::OtherGroup {
            user: caller.user.clone(),
            gid: caller.gid,
            want_gid: gid,
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
    use tandem_proto::auth::KEY_LEN;

    fn key() -> ClusterKey {
        ClusterKey::from_bytes([9; KEY_LEN])
    }

    fn alice() -> Identity {
        Identity::user("alice", 1000, 100)
    }

    #[test]
    fn users_launch_only_as_themselves() {
        assert_eq!(
            authorize_launch(&alice(), &key(), 1, 0, 1000, 100, ""),
            Ok(())
        );
        assert!(matches!(
            authorize_launch(&alice(), &key(), 1, 0, 0, 0, ""),
            Err(Denied::OtherUser { want_uid: 0, .. })
        ));
        assert!(matches!(
            authorize_launch(&alice(), &key(), 1, 0, 1000, 0, ""),
            Err(Denied::OtherGroup { .. })
        ));
    }

    #[test]
    fn daemons_and_root_act_for_any_user() {
        let root = Identity::user("root", 0, 0);
        let worker = Identity::worker("n1", 0, 0);
        for caller in [root, worker] {
            assert_eq!(
                authorize_launch(&caller, &key(), 1, 0, 1000, 100, ""),
                Ok(())
            );
            assert_eq!(authorize_signal(&caller, 1, 0, 1000), Ok(()));
        }
    }

    #[test]
    fn launch_token_must_name_this_step_and_user() {
        let k = key();
        let token_for = |job: u64, step: u32, uid: u32| {
            k.sign(
                &Identity::user(launch_token_subject(job, step), uid, 100),
                0,
            )
        };
        let good = token_for(5, 1, 1000);
        assert_eq!(
            authorize_launch(&alice(), &k, 5, 1, 1000, 100, &good),
            Ok(())
        );
        for bad in [
            token_for(5, 2, 1000),
            token_for(6, 1, 1000),
            token_for(5, 1, 1001),
        ] {
            assert!(matches!(
                authorize_launch(&alice(), &k, 5, 1, 1000, 100, &bad),
                Err(Denied::BadLaunchToken { .. })
            ));
        }
        let foreign = ClusterKey::from_bytes([1; KEY_LEN])
            .sign(&Identity::user(launch_token_subject(5, 1), 1000, 100), 0);
        assert!(authorize_launch(&alice(), &k, 5, 1, 1000, 100, &foreign).is_err());
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
