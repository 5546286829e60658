//! The account tree: accounts, sub-accounts and user associations in one arena, with their
//! raw shares, and the edits `sacctmgr` makes to it (add, remove, set shares, users created
//! on first use). Also the one naming rule for accounts, users and QOS.
//!
//! The arena's invariants (a parent is created before its children, removal tombstones,
//! indices stay stable) are kept here; usage (`usage`) and ranking (`rank`) read the
//! arena through `pub(super)` fields and never change its shape.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{DEFAULT_SHARES, ROOT_ACCOUNT};

/// Index of an association in an [`AssocTree`]. Stable for the tree's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AssocIdx(u32);

impl AssocIdx {
    /// Position in the tree's arena (and in a [`FairShareTable`](super::FairShareTable)).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Whether an association is an account (has children) or a user (is ranked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AssocKind {
    Account,
    User,
}

/// Errors from editing the account tree. Each names what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FairShareError {
    #[error("account {0:?} already exists")]
    DuplicateAccount(String),
    #[error("user {user:?} already has an association with account {account:?}")]
    DuplicateUser { user: String, account: String },
    #[error("account {0:?} does not exist")]
    UnknownAccount(String),
    #[error("user {user:?} has no association with account {account:?}")]
    UnknownUser { user: String, account: String },
    #[error("account {0:?} still has associations under it")]
    AccountNotEmpty(String),
    #[error("the root account cannot be removed")]
    RemoveRoot,
    #[error("invalid name {0:?}: {1}")]
    BadName(String, &'static str),
}

/// One association: an account or a (user, account) pair.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Assoc {
    /// Account name, or the user name for a user association.
    pub(super) name: String,
    pub(super) kind: AssocKind,
    /// `None` only for the root account.
    pub(super) parent: Option<AssocIdx>,
    /// Live children, in creation order (the order `sshare` lists them).
    pub(super) children: Vec<AssocIdx>,
    /// Raw shares (Slurm `Fairshare=`), relative to siblings only.
    pub(super) shares: u32,
    /// Decayed usage charged to this association itself. Accounts normally
    /// hold none: their usage is the sum over their subtree.
    pub(super) usage: f64,
    /// Tombstone: removed associations keep their index but take no part.
    pub(super) removed: bool,
    /// A user association created on first use (a job's submit without association
    /// enforcement), not listed in the configuration. The tree is the only record of it,
    /// so a restart that rebuilds the tree from the lists must carry it over, or its usage
    /// and its jobs' fair share are lost. Trees stored before the flag load as `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) auto: bool,
}

/// The account tree (accounts, sub-accounts, user associations) with shares and
/// decayed usage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssocTree {
    pub(super) assocs: Vec<Assoc>,
    /// Account names are unique across the tree, as in Slurm.
    accounts: HashMap<String, AssocIdx>,
    /// account -> user -> association; a user may belong to several accounts.
    /// Nested so a look-up by `&str` allocates nothing (it runs per job per pass).
    users: HashMap<String, HashMap<String, AssocIdx>>,
}

impl Default for AssocTree {
    fn default() -> Self {
        Self::new()
    }
}

impl AssocTree {
    /// A tree holding only the `root` account.
    pub fn new() -> Self {
        let root = Assoc {
            name: ROOT_ACCOUNT.to_string(),
            kind: AssocKind::Account,
            parent: None,
            children: Vec::new(),
            shares: DEFAULT_SHARES,
            usage: 0.0,
            removed: false,
            auto: false,
        };
        let mut accounts = HashMap::new();
        accounts.insert(ROOT_ACCOUNT.to_string(), AssocIdx(0));
        Self {
            assocs: vec![root],
            accounts,
            users: HashMap::new(),
        }
    }

    /// The root account.
    pub fn root(&self) -> AssocIdx {
        AssocIdx(0)
    }

    /// Number of slots in the arena (live and removed); the length of a
    /// [`FairShareTable`](super::FairShareTable).
    pub fn len(&self) -> usize {
        self.assocs.len()
    }

    /// Whether the tree holds only the root.
    pub fn is_empty(&self) -> bool {
        self.assocs.iter().skip(1).all(|a| a.removed)
    }

    /// Add account `name` under account `parent`.
    pub fn add_account(
        &mut self,
        name: &str,
        parent: &str,
        shares: u32,
    ) -> Result<AssocIdx, FairShareError> {
        check_name(name)?;
        if self.accounts.contains_key(name) {
            return Err(FairShareError::DuplicateAccount(name.to_string()));
        }
        let parent_idx = self.account_idx(parent)?;
        let idx = self.push(name, AssocKind::Account, parent_idx, shares);
        self.accounts.insert(name.to_string(), idx);
        Ok(idx)
    }

    /// Associate user `user` with account `account`.
    pub fn add_user(
        &mut self,
        user: &str,
        account: &str,
        shares: u32,
    ) -> Result<AssocIdx, FairShareError> {
        check_name(user)?;
        if self.user(user, account).is_some() {
            return Err(FairShareError::DuplicateUser {
                user: user.to_string(),
                account: account.to_string(),
            });
        }
        let parent_idx = self.account_idx(account)?;
        let idx = self.push(user, AssocKind::User, parent_idx, shares);
        self.users
            .entry(account.to_string())
            .or_default()
            .insert(user.to_string(), idx);
        Ok(idx)
    }

    /// Associate `user` with `account` on first use (see [`AssocTree::is_auto`]).
    pub fn add_user_on_first_use(
        &mut self,
        user: &str,
        account: &str,
        shares: u32,
    ) -> Result<AssocIdx, FairShareError> {
        let idx = self.add_user(user, account, shares)?;
        self.assocs[idx.index()].auto = true;
        Ok(idx)
    }

    /// Whether a user association was created on first use rather than configured.
    pub fn is_auto(&self, idx: AssocIdx) -> bool {
        self.assocs[idx.index()].auto
    }

    /// Marks a user association as created on first use (a stored tree from before the
    /// mark existed; see `tandem-controller`'s recovery). Accounts are never marked.
    pub fn mark_auto(&mut self, idx: AssocIdx) {
        if let Some(a) = self.assocs.get_mut(idx.index())
            && a.kind == AssocKind::User
        {
            a.auto = true;
        }
    }

    /// Remove a user association. Its usage leaves the tree with it.
    pub fn remove_user(&mut self, user: &str, account: &str) -> Result<(), FairShareError> {
        let idx = self
            .users
            .get_mut(account)
            .and_then(|m| m.remove(user))
            .ok_or_else(|| FairShareError::UnknownUser {
                user: user.to_string(),
                account: account.to_string(),
            })?;
        self.unlink(idx);
        Ok(())
    }

    /// Remove an account that has no associations left under it.
    pub fn remove_account(&mut self, name: &str) -> Result<(), FairShareError> {
        let idx = self.account_idx(name)?;
        if idx == self.root() {
            return Err(FairShareError::RemoveRoot);
        }
        if !self.assocs[idx.index()].children.is_empty() {
            return Err(FairShareError::AccountNotEmpty(name.to_string()));
        }
        self.accounts.remove(name);
        self.users.remove(name);
        self.unlink(idx);
        Ok(())
    }

    /// Change the raw shares of an association.
    pub fn set_shares(&mut self, idx: AssocIdx, shares: u32) {
        if let Some(a) = self.assocs.get_mut(idx.index()) {
            a.shares = shares;
        }
    }

    /// The account named `name`.
    pub fn account(&self, name: &str) -> Option<AssocIdx> {
        self.accounts.get(name).copied()
    }

    /// The association of `user` with `account`.
    pub fn user(&self, user: &str, account: &str) -> Option<AssocIdx> {
        self.users.get(account)?.get(user).copied()
    }

    /// Name (account or user) of an association.
    pub fn name(&self, idx: AssocIdx) -> &str {
        &self.assocs[idx.index()].name
    }

    /// Kind of an association.
    pub fn kind(&self, idx: AssocIdx) -> AssocKind {
        self.assocs[idx.index()].kind
    }

    /// Parent account (`None` for root).
    pub fn parent(&self, idx: AssocIdx) -> Option<AssocIdx> {
        self.assocs[idx.index()].parent
    }

    /// Live children in creation order.
    pub fn children(&self, idx: AssocIdx) -> &[AssocIdx] {
        &self.assocs[idx.index()].children
    }

    /// Raw shares of an association.
    pub fn shares(&self, idx: AssocIdx) -> u32 {
        self.assocs[idx.index()].shares
    }

    /// Usage charged to this association itself (not its subtree).
    pub fn own_usage(&self, idx: AssocIdx) -> f64 {
        self.assocs[idx.index()].usage
    }

    /// Live associations in depth-first order with their depth (root = 0):
    /// the order `sshare` prints them in.
    pub fn walk(&self) -> Vec<(AssocIdx, usize)> {
        let mut out = Vec::with_capacity(self.assocs.len());
        let mut stack = vec![(self.root(), 0usize)];
        while let Some((idx, depth)) = stack.pop() {
            out.push((idx, depth));
            for &c in self.children(idx).iter().rev() {
                stack.push((c, depth + 1));
            }
        }
        out
    }

    fn account_idx(&self, name: &str) -> Result<AssocIdx, FairShareError> {
        self.accounts
            .get(name)
            .copied()
            .ok_or_else(|| FairShareError::UnknownAccount(name.to_string()))
    }

    fn push(&mut self, name: &str, kind: AssocKind, parent: AssocIdx, shares: u32) -> AssocIdx {
        let idx = AssocIdx(self.assocs.len() as u32);
        self.assocs.push(Assoc {
            name: name.to_string(),
            kind,
            parent: Some(parent),
            children: Vec::new(),
            shares,
            usage: 0.0,
            removed: false,
            auto: false,
        });
        self.assocs[parent.index()].children.push(idx);
        idx
    }

    fn unlink(&mut self, idx: AssocIdx) {
        let a = &mut self.assocs[idx.index()];
        a.removed = true;
        a.usage = 0.0;
        if let Some(p) = a.parent {
            self.assocs[p.index()].children.retain(|c| *c != idx);
        }
    }
}

/// Longest account, user or QOS name, in bytes (Slurm's own limits are larger, but a name
/// is a table cell and a map key, not a document).
pub const MAX_NAME_LEN: usize = 64;

/// The one rule for account, user and QOS names. The rejected characters separate names
/// in sacctmgr lists (`,`), parsable output (`|`) and `user:account` pairs (`:`); control
/// characters and whitespace would corrupt fixed-width tables. The name in the error is
/// cut short so that the message stays one readable line.
pub fn check_name(name: &str) -> Result<(), FairShareError> {
    let problem = if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("longer than 64 bytes")
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("must not contain whitespace or control characters")
    } else if name.contains([',', '|', ':']) {
        Some("must not contain ',', '|' or ':'")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => {
            let shown: String = name.chars().take(MAX_NAME_LEN).collect();
            let shown = if shown.len() < name.len() {
                shown + "..."
            } else {
                shown
            };
            Err(FairShareError::BadName(shown, p))
        }
    }
}
