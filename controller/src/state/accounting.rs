//! The state actor's side of `tandem.v1.Accounting` beyond sacct: run-time changes to
//! accounts, user associations and QOS (sacctmgr), and the numbers sshare and sprio show.
//!
//! A change request is applied to the live `State` item by item and undone as a whole if any
//! item fails ([`State::rollback_accounting`](tandem_sched::State::rollback_accounting)), so
//! `sacctmgr add account a,b` with a bad `b` adds neither. Accepted changes mark the configuration and the tree changed; the actor's
//! flush persists both (`cluster_config`, `assoc_tree`) in the batch that answers the caller,
//! and the next pass sees the new shares, priorities and limits.
//!
//! The functions over `State` here are pure (no I/O, `now` is an argument), so their tests
//! need no controller.
//!
//! - [`changes`]: sacctmgr's add, modify and delete, checked and applied to `State`.
//! - [`views`]: what `sacctmgr show`, `sshare` and `sprio` print, read from `State`.

use tandem_proto::v1;

use super::{Actor, Reply};

mod changes;
mod views;

use changes::apply;
pub use changes::at_most;
use views::{associations, priorities, qos_list, shares};

/// Requests for the actor. The handler has already checked that a change comes from an
/// operator.
pub enum AcctCommand {
    Change {
        change: Change,
        reply: Reply<v1::AccountingChangeResponse>,
    },
    Associations {
        reply: Reply<v1::ListAssociationsResponse>,
    },
    Qos {
        reply: Reply<v1::ListQosResponse>,
    },
    Shares {
        reply: Reply<v1::ListSharesResponse>,
    },
    Priorities {
        req: v1::ListPrioritiesRequest,
        reply: Reply<v1::ListPrioritiesResponse>,
    },
}

/// One sacctmgr change, as it came over the wire.
#[derive(Debug, Clone)]
pub enum Change {
    AddAccount(v1::AddAccountRequest),
    ModifyAccount(v1::ModifyAccountRequest),
    DeleteAccount(v1::DeleteAccountRequest),
    AddUser(v1::AddUserRequest),
    ModifyUser(v1::ModifyUserRequest),
    DeleteUser(v1::DeleteUserRequest),
    AddQos(v1::AddQosRequest),
    ModifyQos(v1::ModifyQosRequest),
    DeleteQos(v1::DeleteQosRequest),
}

impl Actor {
    pub(super) fn accounting(&mut self, cmd: AcctCommand) {
        match cmd {
            AcctCommand::Change { change, reply } => {
                let snap = self.st.accounting_snapshot();
                match apply(&mut self.st, change) {
                    Ok(changed) => {
                        // New shares, priorities or limits may reorder or unblock the queue.
                        self.pass_wanted = true;
                        self.reply_after_commit(reply, v1::AccountingChangeResponse { changed });
                    }
                    Err(e) => {
                        self.st.rollback_accounting(snap);
                        let _ = reply.send(Err(e));
                    }
                }
            }
            AcctCommand::Associations { reply } => {
                let _ = reply.send(Ok(associations(&self.st)));
            }
            AcctCommand::Qos { reply } => {
                let _ = reply.send(Ok(qos_list(&self.st)));
            }
            AcctCommand::Shares { reply } => {
                let _ = reply.send(Ok(shares(&self.st)));
            }
            AcctCommand::Priorities { req, reply } => {
                let now = self.now();
                let _ = reply.send(Ok(priorities(&self.st, &req, now)));
            }
        }
    }
}
