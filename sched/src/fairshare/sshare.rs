//! `sshare -a -l`'s rows: the tree walked depth-first in creation order, joined with a
//! computed [`FairShareTable`]. Presentation only: the controller serves these rows and the
//! CLI prints them.

use serde::{Deserialize, Serialize};

use super::rank::{AssocShare, FairShareTable};
use super::tree::{AssocKind, AssocTree};

/// One line of `sshare -a -l`: the association, where it sits, and its numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SshareRow {
    /// Depth below root (root = 0), for `sshare`'s indentation.
    pub depth: usize,
    /// The account; for a user association, the account it charges.
    pub account: String,
    /// The user of a user association; `None` for an account.
    pub user: Option<String>,
    pub share: AssocShare,
}

/// `sshare`'s rows, depth-first in creation order.
pub fn sshare_rows(tree: &AssocTree, table: &FairShareTable) -> Vec<SshareRow> {
    tree.walk()
        .into_iter()
        .filter_map(|(idx, depth)| {
            let share = table.get(idx)?.clone();
            let (account, user) = match tree.kind(idx) {
                AssocKind::Account => (tree.name(idx).to_string(), None),
                AssocKind::User => {
                    let parent = tree.parent(idx).unwrap_or(tree.root());
                    (
                        tree.name(parent).to_string(),
                        Some(tree.name(idx).to_string()),
                    )
                }
            };
            Some(SshareRow {
                depth,
                account,
                user,
                share,
            })
        })
        .collect()
}
