//! The state actor's side of sacctmgr's changes: run-time changes to accounts, user
//! associations and QOS.
//!
//! What a change does is the handler's (`api/accounting/changes.rs` checks the request and
//! applies it to `State`); how it is applied is the actor's: on the live `State`, item by
//! item, undone as a whole if any item fails
//! ([`State::rollback_accounting`](tandem_sched::State::rollback_accounting)), so
//! `sacctmgr add account a,b` with a bad `b` adds neither. Accepted changes mark the
//! configuration and the tree changed; the actor's flush persists both (`cluster_config`,
//! `assoc_tree`) in the batch that answers the caller, and the next pass sees the new
//! shares, priorities and limits. The views (`sacctmgr show`, sshare, sprio) are plain reads
//! ([`super::Handle::read`]).

use tandem_sched::State;
use tonic::Status;

use super::{Actor, Reply};

/// One sacctmgr change over the live state: the lines it changed, or why it was refused
/// (the actor then rolls back whatever it applied).
pub type AcctChange = Box<dyn FnOnce(&mut State) -> Result<Vec<String>, Status> + Send>;

impl Actor {
    pub(super) fn accounting_change(&mut self, apply: AcctChange, reply: Reply<Vec<String>>) {
        let snap = self.st.accounting_snapshot();
        match apply(&mut self.st) {
            Ok(changed) => {
                // New shares, priorities or limits may reorder or unblock the queue.
                self.pacing.want();
                self.reply_after_commit(reply, changed);
            }
            Err(e) => {
                self.st.rollback_accounting(snap);
                let _ = reply.send(Err(e));
            }
        }
    }
}
