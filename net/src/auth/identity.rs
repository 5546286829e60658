//! Who a caller is ([`Identity`]) and what it may do ([`Role`]): the claims a credential
//! signs, the administrators the controller's configuration adds ([`Admins`]), and how a
//! handler reads the verified caller of a request ([`identity`]).
//!
//! These are plain data, apart from the key and the interceptors, so that the controller's
//! and the worker's policy code can name them without the signing machinery.

use serde::{Deserialize, Serialize};
use tonic::{Request, Status};

/// What a caller may do. Each role is a distinct credential: the agent issues only `user`
/// (and `admin` for uid 0); `worker`, `bridge` and `operator` are signed by daemons that hold
/// the key. The controller also raises configured users to `admin` ([`Admins`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A researcher: submits and controls their own jobs.
    User,
    /// A node agent: speaks only for the node its credential names (`Identity::user`).
    Worker,
    /// Root or a configured administrator: may control every job, node and account.
    Admin,
    /// The Kubernetes scheduler bridge: submits and controls placeholder jobs.
    Bridge,
    /// The Kubernetes operator: drains, resumes and removes nodes.
    Operator,
}

/// The authenticated caller of a request, as signed into its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user name; for a worker, the node it speaks for; for a service, its name.
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub role: Role,
}

impl Identity {
    /// A user identity; uid 0 becomes an admin, as root is in Slurm.
    pub fn user(user: impl Into<String>, uid: u32, gid: u32) -> Self {
        let role = if uid == 0 { Role::Admin } else { Role::User };
        Self {
            user: user.into(),
            uid,
            gid,
            role,
        }
    }

    /// The identity a worker daemon presents: it names the node it speaks for.
    pub fn worker(node_name: impl Into<String>, uid: u32, gid: u32) -> Self {
        Self {
            user: node_name.into(),
            uid,
            gid,
            role: Role::Worker,
        }
    }

    /// A service identity (`Role::Bridge` or `Role::Operator`).
    pub fn service(role: Role, name: impl Into<String>, uid: u32, gid: u32) -> Self {
        Self {
            user: name.into(),
            uid,
            gid,
            role,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The node a worker identity speaks for.
    pub fn node(&self) -> Option<&str> {
        (self.role == Role::Worker).then_some(self.user.as_str())
    }
}

/// Users raised to administrator by the controller's configuration (Slurm's AdminLevel),
/// so staff need not be root to run `sacctmgr` or `scontrol update node`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admins {
    pub uids: std::collections::HashSet<u32>,
    pub users: std::collections::HashSet<String>,
}

impl Admins {
    /// Parses `alice,1234,bob`: numbers are uids, anything else user names.
    pub fn parse(list: &[String]) -> Self {
        let mut a = Self::default();
        for item in list.iter().flat_map(|s| s.split(',')) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            match item.parse::<u32>() {
                Ok(uid) => {
                    a.uids.insert(uid);
                }
                Err(_) => {
                    a.users.insert(item.to_owned());
                }
            }
        }
        a
    }

    /// `who` with the role the configuration gives it: a listed user becomes an admin.
    pub fn apply(&self, mut who: Identity) -> Identity {
        if who.role == Role::User
            && (self.uids.contains(&who.uid) || self.users.contains(&who.user))
        {
            who.role = Role::Admin;
        }
        who
    }
}

/// The verified identity of a request, or `unauthenticated` if the interceptor did not run
/// (a server wired without [`ServerAuth`](super::ServerAuth) must fail closed, not open).
#[allow(clippy::result_large_err)]
pub fn identity<T>(request: &Request<T>) -> Result<&Identity, Status> {
    request
        .extensions()
        .get::<Identity>()
        .ok_or_else(|| Status::unauthenticated("request carries no verified identity"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::test_util::alice;

    #[test]
    fn root_is_admin_and_admins_are_configurable() {
        assert!(Identity::user("root", 0, 0).is_admin());
        assert!(!alice().is_admin());
        let admins = Admins::parse(&["staff, 1234".into()]);
        assert!(admins.apply(Identity::user("staff", 5, 5)).is_admin());
        assert!(admins.apply(Identity::user("x", 1234, 5)).is_admin());
        assert!(!admins.apply(alice()).is_admin());
        // Only users are raised: a worker named like an admin stays a worker.
        assert_eq!(
            admins.apply(Identity::worker("staff", 0, 0)).role,
            Role::Worker
        );
    }

    #[test]
    fn unintercepted_request_has_no_identity() {
        let req = Request::new(());
        assert_eq!(
            identity(&req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }
}
