//! Fair share by Slurm's **Fair Tree** algorithm.
//!
//! The account tree holds accounts, sub-accounts and users (a user under an
//! account is an *association*, as in Slurm). Each association has raw shares
//! and accumulates usage in billing-weighted TRES-seconds, decayed with a
//! half-life. [`AssocTree::compute`] turns shares and usage into the numbers
//! `sshare` prints and into a fair-share factor per user association.
//!
//! # Algorithm (Slurm `fair_tree.html`)
//!
//! ```text
//!   root ─┬─ A (LF 2.0) ─┬─ alice (LF 3.0)   rank 4 -> 4/4
//!         │              └─ bob   (LF 0.5)   rank 3 -> 3/4
//!         └─ B (LF 0.7) ─┬─ carol (LF inf)   rank 2 -> 2/4
//!                        └─ dave  (LF 1.0)   rank 1 -> 1/4
//! ```
//!
//! 1. At every level, each child's *level fair share* is `LF = S / U`, with
//!    `S` its shares over the sum of its siblings' shares (itself included)
//!    and `U` its usage over the sum of its siblings' usage. No usage means
//!    `LF = inf`; zero shares means `LF = 0`.
//! 2. Children are sorted by `LF`, highest first, and visited depth-first:
//!    a user gets the next rank, an account is descended into. So if account A
//!    outranks its sibling B, every user under A outranks every user under B.
//! 3. Ranks count down from the number of users `n`; the factor is
//!    `rank / n` (the first user visited gets 1.0, the last `1/n`).
//!
//! Ties, as the documentation states them: sibling users with equal `LF` get
//! the same rank; a user tied with a sibling account gets the same rank as that
//! account's highest ranked user; sibling accounts with equal `LF` have their
//! children merged into one list before sorting. A tie consumes ranks as if it
//! were not one (competition ranking: 4, 4, 2, ...), as Slurm's implementation
//! does with its "rank not tied" counter.
//!
//! # Invariants
//!
//! - A parent is always created before its children, so its index is smaller;
//!   subtree sums are one reverse sweep over the arena.
//! - Indices ([`AssocIdx`]) are stable: removing an association tombstones it.
//! - Usage is never negative; decay multiplies, charging adds.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Slurm's default `PriorityDecayHalfLife` (7 days).
pub const DEFAULT_HALF_LIFE_S: u64 = 7 * 24 * 3600;
/// Shares an association gets when none are given (Slurm's `Fairshare=1`).
pub const DEFAULT_SHARES: u32 = 1;
/// Name of the root account that every tree starts with.
pub const ROOT_ACCOUNT: &str = "root";

/// Usage left after `elapsed_s` seconds of exponential decay with the given
/// half-life. A half-life of 0 disables decay, as `PriorityDecayHalfLife=0`
/// does in Slurm.
pub fn decay(usage: f64, elapsed_s: u64, half_life_s: u64) -> f64 {
    if half_life_s == 0 || elapsed_s == 0 {
        return usage;
    }
    usage * 0.5_f64.powf(elapsed_s as f64 / half_life_s as f64)
}

/// Billing weights per TRES (Slurm's `TRESBillingWeights`). Usage charged to an
/// association is `billing rate x seconds`; GPUs weigh most by default because
/// they are the scarce resource of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BillingWeights {
    /// Per allocated CPU.
    pub cpu: f64,
    /// Per GiB of allocated memory.
    pub mem_gb: f64,
    /// Per allocated GPU (any type).
    pub gpu: f64,
}

impl Default for BillingWeights {
    fn default() -> Self {
        Self {
            cpu: 1.0,
            mem_gb: 0.25,
            gpu: 16.0,
        }
    }
}

impl BillingWeights {
    /// Billing rate (units per second) of an allocation: the weighted sum of
    /// its TRES, like Slurm's billing TRES without `MAX_TRES`.
    pub fn rate(&self, cpus: u64, mem_mb: u64, gpus: u64) -> f64 {
        self.cpu * cpus as f64 + self.mem_gb * (mem_mb as f64 / 1024.0) + self.gpu * gpus as f64
    }

    /// Usage (billing-weighted TRES-seconds) of an allocation held `seconds`.
    pub fn usage(&self, cpus: u64, mem_mb: u64, gpus: u64, seconds: u64) -> f64 {
        self.rate(cpus, mem_mb, gpus) * seconds as f64
    }
}

/// Index of an association in an [`AssocTree`]. Stable for the tree's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AssocIdx(u32);

impl AssocIdx {
    /// Position in the tree's arena (and in a [`FairShareTable`]).
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
struct Assoc {
    /// Account name, or the user name for a user association.
    name: String,
    kind: AssocKind,
    /// `None` only for the root account.
    parent: Option<AssocIdx>,
    /// Live children, in creation order (the order `sshare` lists them).
    children: Vec<AssocIdx>,
    /// Raw shares (Slurm `Fairshare=`), relative to siblings only.
    shares: u32,
    /// Decayed usage charged to this association itself. Accounts normally
    /// hold none: their usage is the sum over their subtree.
    usage: f64,
    /// Tombstone: removed associations keep their index but take no part.
    removed: bool,
    /// A user association created on first use (a job's submit without association
    /// enforcement), not listed in the configuration. The tree is the only record of it,
    /// so a restart that rebuilds the tree from the lists must carry it over, or its usage
    /// and its jobs' fair share are lost. Trees stored before the flag load as `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    auto: bool,
}

/// The account tree (accounts, sub-accounts, user associations) with shares and
/// decayed usage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AssocTree {
    assocs: Vec<Assoc>,
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
    /// [`FairShareTable`].
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

    /// Add `usage` (billing-weighted TRES-seconds) to an association. Negative
    /// or non-finite amounts are ignored: usage only grows by charging.
    pub fn charge(&mut self, idx: AssocIdx, usage: f64) {
        if !(usage.is_finite() && usage > 0.0) {
            return;
        }
        if let Some(a) = self.assocs.get_mut(idx.index()) {
            a.usage += usage;
        }
    }

    /// Takes back `usage` charged for time a job did not run; never below zero.
    pub fn refund(&mut self, idx: AssocIdx, usage: f64) {
        if !(usage.is_finite() && usage > 0.0) {
            return;
        }
        if let Some(a) = self.assocs.get_mut(idx.index()) {
            a.usage = (a.usage - usage).max(0.0);
        }
    }

    /// Decay every association's usage by `elapsed_s` seconds of half-life
    /// decay. One multiplication per association.
    pub fn decay_all(&mut self, elapsed_s: u64, half_life_s: u64) {
        if half_life_s == 0 || elapsed_s == 0 {
            return;
        }
        let factor = decay(1.0, elapsed_s, half_life_s);
        for a in &mut self.assocs {
            a.usage *= factor;
        }
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

    /// Compute shares, usage, level fair share, ranks and fair-share factors
    /// for every association: once per scheduling pass, O(A log A).
    pub fn compute(&self) -> FairShareTable {
        let n = self.assocs.len();
        // Subtree usage: children have larger indices than their parents.
        let mut subtree = vec![0.0_f64; n];
        for i in (0..n).rev() {
            let a = &self.assocs[i];
            if a.removed {
                continue;
            }
            subtree[i] += a.usage;
            if let Some(p) = a.parent {
                subtree[p.index()] += subtree[i];
            }
        }

        let mut rows: Vec<AssocShare> = (0..n)
            .map(|i| AssocShare {
                raw_shares: self.assocs[i].shares,
                norm_shares: 0.0,
                raw_usage: subtree[i],
                effective_usage: 0.0,
                level_fs: 0.0,
                fairshare: None,
                rank: None,
            })
            .collect();
        rows[0].norm_shares = 1.0;
        rows[0].effective_usage = 1.0;
        rows[0].level_fs = f64::INFINITY;

        let mut user_count = 0u32;
        for a in &self.assocs {
            if a.removed {
                continue;
            }
            if a.kind == AssocKind::User {
                user_count += 1;
            }
            let shares_sum: u64 = a.children.iter().map(|c| u64::from(self.shares(*c))).sum();
            let usage_sum: f64 = a.children.iter().map(|c| subtree[c.index()]).sum();
            for &c in &a.children {
                let row = &mut rows[c.index()];
                row.norm_shares = if shares_sum == 0 {
                    0.0
                } else {
                    f64::from(row.raw_shares) / shares_sum as f64
                };
                row.effective_usage = if usage_sum > 0.0 {
                    row.raw_usage / usage_sum
                } else {
                    0.0
                };
                row.level_fs = level_fs(row.norm_shares, row.effective_usage);
            }
        }

        let mut ranker = Ranker {
            tree: self,
            rows: &mut rows,
            rank_not_tied: user_count,
            user_count,
        };
        let top = self.children(self.root()).to_vec();
        ranker.visit(top, None);

        FairShareTable { rows, user_count }
    }

    fn account_idx(&self, name: &str) -> Result<AssocIdx, FairShareError> {
        self.accounts
            .get(name)
            .copied()
            .ok_or_else(|| FairShareError::UnknownAccount(name.to_string()))
    }

    /// Copies each association's own usage from `old` where the same association (the
    /// same account, or the same user under the same account) exists there. Rebuilding a
    /// tree from its account and user lists and then carrying usage over keeps the two
    /// consistent after a restart without forgetting what was charged.
    pub fn carry_usage_from(&mut self, old: &AssocTree) {
        for i in 0..self.assocs.len() {
            let a = &self.assocs[i];
            if a.removed {
                continue;
            }
            let found = match a.kind {
                AssocKind::Account => old.account(&a.name),
                AssocKind::User => {
                    let parent = a
                        .parent
                        .map_or(ROOT_ACCOUNT, |p| &self.assocs[p.index()].name);
                    old.user(&a.name, parent)
                }
            };
            if let Some(o) = found {
                let usage = old.own_usage(o);
                self.assocs[i].usage = if usage.is_finite() {
                    usage.max(0.0)
                } else {
                    0.0
                };
            }
        }
    }

    /// Re-creates, after [`AssocTree::carry_usage_from`], the user associations `old`
    /// created on first use that this tree lacks, with their shares and usage (appended in
    /// their old order). One whose account is gone is dropped, as its usage is: nothing
    /// could charge it.
    pub fn carry_auto_users_from(&mut self, old: &AssocTree) {
        for (i, _) in old.walk() {
            let a = &old.assocs[i.index()];
            if a.kind != AssocKind::User || !a.auto {
                continue;
            }
            let Some(account) = a.parent.map(|p| old.name(p)) else {
                continue;
            };
            if self.account(account).is_none() || self.user(&a.name, account).is_some() {
                continue;
            }
            if let Ok(idx) = self.add_user_on_first_use(&a.name, account, a.shares) {
                self.assocs[idx.index()].usage = if a.usage.is_finite() {
                    a.usage.max(0.0)
                } else {
                    0.0
                };
            }
        }
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

/// `LF = S / U`: zero shares rank last, no usage ranks first.
fn level_fs(norm_shares: f64, effective_usage: f64) -> f64 {
    if norm_shares == 0.0 {
        0.0
    } else if effective_usage == 0.0 {
        f64::INFINITY
    } else {
        norm_shares / effective_usage
    }
}

/// Depth-first ranking state for one [`AssocTree::compute`].
struct Ranker<'a> {
    tree: &'a AssocTree,
    rows: &'a mut [AssocShare],
    /// Counts down by one per user visited, tie or not (Slurm's `rnt`).
    rank_not_tied: u32,
    user_count: u32,
}

impl Ranker<'_> {
    /// Rank a list of siblings (or the merged children of tied accounts).
    /// `carry` is the rank the first users reached must share: set when an
    /// account was tied with a user, so the account's best user ties with it.
    fn visit(&mut self, mut siblings: Vec<AssocIdx>, mut carry: Option<u32>) {
        // Highest LF first; the index keeps equal LFs in creation order, so
        // the result is deterministic.
        siblings.sort_by(|a, b| {
            let (la, lb) = (self.rows[a.index()].level_fs, self.rows[b.index()].level_fs);
            lb.total_cmp(&la).then(a.cmp(b))
        });
        let mut start = 0;
        while start < siblings.len() {
            let lf = self.rows[siblings[start].index()].level_fs;
            let mut end = start + 1;
            while end < siblings.len() && self.rows[siblings[end].index()].level_fs == lf {
                end += 1;
            }
            let group = &siblings[start..end];
            let group_rank = carry.take().unwrap_or(self.rank_not_tied);
            let mut merged = Vec::new();
            for &idx in group {
                match self.tree.kind(idx) {
                    AssocKind::User => {
                        let row = &mut self.rows[idx.index()];
                        row.rank = Some(group_rank);
                        row.fairshare = Some(f64::from(group_rank) / f64::from(self.user_count));
                        self.rank_not_tied -= 1;
                    }
                    AssocKind::Account => merged.extend_from_slice(self.tree.children(idx)),
                }
            }
            if !merged.is_empty() {
                // With no user in the group, group_rank is the next rank anyway.
                self.visit(merged, Some(group_rank));
            }
            start = end;
        }
    }
}

/// What `sshare` shows for one association, Fair Tree flavour: shares and
/// effective usage are normalised among siblings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssocShare {
    /// `RawShares`.
    pub raw_shares: u32,
    /// `NormShares`: shares over the sum of siblings' shares.
    pub norm_shares: f64,
    /// `RawUsage`: decayed billing-weighted TRES-seconds of the subtree.
    pub raw_usage: f64,
    /// `EffectvUsage`: usage over the sum of siblings' usage.
    pub effective_usage: f64,
    /// `LevelFS`: `NormShares / EffectvUsage` (inf with no usage).
    pub level_fs: f64,
    /// `FairShare`: the factor, for user associations only.
    pub fairshare: Option<f64>,
    /// Rank among all users (`n` = best), for user associations only.
    pub rank: Option<u32>,
}

/// Result of one [`AssocTree::compute`]: a row per association, indexed by
/// [`AssocIdx`]. Look-ups are O(1), so a pass computes it once and reads it
/// for every pending job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FairShareTable {
    rows: Vec<AssocShare>,
    user_count: u32,
}

impl FairShareTable {
    /// The row of an association.
    pub fn get(&self, idx: AssocIdx) -> Option<&AssocShare> {
        self.rows.get(idx.index())
    }

    /// Fair-share factor in `(0, 1]` of a user association; 0 for accounts and
    /// unknown indices (a job without an association gets no fair-share boost).
    pub fn factor(&self, idx: AssocIdx) -> f64 {
        self.get(idx).and_then(|r| r.fairshare).unwrap_or(0.0)
    }

    /// Number of ranked user associations.
    pub fn user_count(&self) -> u32 {
        self.user_count
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// root
    /// ├── physics (shares 60)        usage 100 of 200  -> S 0.6, U 0.5, LF 1.2
    /// │   ├── alice (1)              usage  90 of 100  -> S 0.5, U 0.9, LF 0.556
    /// │   └── bob   (1)              usage  10 of 100  -> S 0.5, U 0.1, LF 5
    /// └── chem    (shares 40)        usage 100 of 200  -> S 0.4, U 0.5, LF 0.8
    ///     ├── carol (3)              usage   0         -> LF inf
    ///     └── dave  (1)              usage 100 of 100  -> S 0.25, U 1, LF 0.25
    ///
    /// physics outranks chem, so both physics users come first even though
    /// carol has never run anything: bob (4/4), alice (3/4), carol (2/4),
    /// dave (1/4).
    #[test]
    fn account_order_dominates_user_order() {
        let mut t = AssocTree::new();
        t.add_account("physics", "root", 60).unwrap();
        t.add_account("chem", "root", 40).unwrap();
        let alice = t.add_user("alice", "physics", 1).unwrap();
        let bob = t.add_user("bob", "physics", 1).unwrap();
        let carol = t.add_user("carol", "chem", 3).unwrap();
        let dave = t.add_user("dave", "chem", 1).unwrap();
        t.charge(alice, 90.0);
        t.charge(bob, 10.0);
        t.charge(dave, 100.0);

        let fs = t.compute();
        assert_eq!(fs.factor(bob), 1.0);
        assert_eq!(fs.factor(alice), 0.75);
        assert_eq!(fs.factor(carol), 0.5);
        assert_eq!(fs.factor(dave), 0.25);

        let physics = fs.get(t.account("physics").unwrap()).unwrap();
        assert!(close(physics.norm_shares, 0.6));
        assert!(close(physics.effective_usage, 0.5));
        assert!(close(physics.level_fs, 1.2));
        assert!(close(physics.raw_usage, 100.0));
        assert_eq!(physics.fairshare, None);
        let a = fs.get(alice).unwrap();
        assert!(close(a.level_fs, 0.5 / 0.9));
        assert!(fs.get(carol).unwrap().level_fs.is_infinite());
        assert!(close(fs.get(dave).unwrap().norm_shares, 0.25));
    }

    #[test]
    fn rebuilt_tree_keeps_usage_of_surviving_associations() {
        let mut old = AssocTree::new();
        old.add_account("physics", "root", 60).unwrap();
        old.add_account("chem", "root", 40).unwrap();
        let alice = old.add_user("alice", "physics", 1).unwrap();
        let dave = old.add_user("dave", "chem", 1).unwrap();
        old.charge(alice, 90.0);
        old.charge(dave, 100.0);

        // chem and dave are gone, bio is new, alice moved nowhere.
        let mut t = AssocTree::new();
        t.add_account("physics", "root", 10).unwrap();
        t.add_account("bio", "root", 1).unwrap();
        let a2 = t.add_user("alice", "physics", 1).unwrap();
        let d2 = t.add_user("dave", "bio", 1).unwrap();
        t.carry_usage_from(&old);
        assert_eq!(t.own_usage(a2), 90.0);
        // Same user name under another account: a different association, no usage.
        assert_eq!(t.own_usage(d2), 0.0);
        assert_eq!(t.compute().get(t.root()).unwrap().raw_usage, 90.0);
    }

    /// root
    /// ├── a (1) usage 10 -> S 0.5, U 0.5, LF 1
    /// │   ├── u1 (1) usage 10 -> LF 0.5
    /// │   └── u2 (1) usage  0 -> LF inf
    /// └── b (1) usage 10 -> LF 1, tied with a
    ///     ├── u3 (1) usage  0 -> LF inf
    ///     └── u4 (1) usage 10 -> LF 0.5
    ///
    /// a and b tie, so their children are merged and sorted together:
    /// u2 and u3 (inf) tie at rank 4, u1 and u4 (0.5) tie at rank 2.
    #[test]
    fn tied_accounts_merge_children() {
        let mut t = AssocTree::new();
        t.add_account("a", "root", 1).unwrap();
        t.add_account("b", "root", 1).unwrap();
        let u1 = t.add_user("u1", "a", 1).unwrap();
        let u2 = t.add_user("u2", "a", 1).unwrap();
        let u3 = t.add_user("u3", "b", 1).unwrap();
        let u4 = t.add_user("u4", "b", 1).unwrap();
        t.charge(u1, 10.0);
        t.charge(u4, 10.0);
        let fs = t.compute();
        assert_eq!(fs.get(u2).unwrap().rank, Some(4));
        assert_eq!(fs.get(u3).unwrap().rank, Some(4));
        assert_eq!(fs.get(u1).unwrap().rank, Some(2));
        assert_eq!(fs.get(u4).unwrap().rank, Some(2));
        assert_eq!(fs.factor(u1), 0.5);
    }

    /// root
    /// ├── solo (1)  usage 10 -> S 0.5, U 0.5, LF 1
    /// └── acct (1)  usage 10 -> S 0.5, U 0.5, LF 1 (tied with solo)
    ///     ├── x (1) usage 10 -> LF 0.5
    ///     └── y (1) usage  0 -> LF inf
    ///
    /// solo ties with acct, so it shares the rank of acct's best user y (3);
    /// x comes next with rank 1 (3 users, competition ranking 3, 3, 1).
    #[test]
    fn user_tied_with_account_shares_its_best_rank() {
        let mut t = AssocTree::new();
        let solo = t.add_user("solo", "root", 1).unwrap();
        t.add_account("acct", "root", 1).unwrap();
        let x = t.add_user("x", "acct", 1).unwrap();
        let y = t.add_user("y", "acct", 1).unwrap();
        t.charge(solo, 10.0);
        t.charge(x, 10.0);
        let fs = t.compute();
        assert_eq!(fs.get(solo).unwrap().rank, Some(3));
        assert_eq!(fs.get(y).unwrap().rank, Some(3));
        assert_eq!(fs.get(x).unwrap().rank, Some(1));
        assert!(close(fs.factor(x), 1.0 / 3.0));
    }

    /// Nobody has usage: every LF is inf and every user ties at the top.
    /// A user with zero shares has LF 0 and ranks last.
    #[test]
    fn no_usage_ties_everyone_and_zero_shares_rank_last() {
        let mut t = AssocTree::new();
        t.add_account("a", "root", 1).unwrap();
        let u = t.add_user("u", "a", 1).unwrap();
        let v = t.add_user("v", "a", 1).unwrap();
        let z = t.add_user("z", "a", 0).unwrap();
        let fs = t.compute();
        assert_eq!(fs.factor(u), 1.0);
        assert_eq!(fs.factor(v), 1.0);
        assert!(close(fs.factor(z), 1.0 / 3.0));
    }

    /// Three levels: the deeper account's order is decided at its own level.
    /// root
    /// ├── ai (2)                      usage 300 of 400 -> S 2/3, U 0.75, LF 0.889
    /// │   ├── vision (1)              usage 100 of 300 -> S 0.5, U 1/3, LF 1.5
    /// │   │   └── ann (1)             usage 100        -> LF 1
    /// │   └── nlp (1)                 usage 200 of 300 -> S 0.5, U 2/3, LF 0.75
    /// │       ├── ben (1) usage 150   -> S 0.5, U 0.75, LF 0.667
    /// │       └── cal (1) usage  50   -> S 0.5, U 0.25, LF 2
    /// └── bio (1)                     usage 100 of 400 -> S 1/3, U 0.25, LF 1.333
    ///     └── dan (1) usage 100       -> LF 1
    ///
    /// bio (1.333) before ai (0.889): dan 4; inside ai, vision (1.5) before
    /// nlp (0.75): ann 3; inside nlp, cal (2) before ben: cal 2, ben 1.
    #[test]
    fn three_levels_rank_depth_first() {
        let mut t = AssocTree::new();
        t.add_account("ai", "root", 2).unwrap();
        t.add_account("vision", "ai", 1).unwrap();
        t.add_account("nlp", "ai", 1).unwrap();
        t.add_account("bio", "root", 1).unwrap();
        let ann = t.add_user("ann", "vision", 1).unwrap();
        let ben = t.add_user("ben", "nlp", 1).unwrap();
        let cal = t.add_user("cal", "nlp", 1).unwrap();
        let dan = t.add_user("dan", "bio", 1).unwrap();
        t.charge(ann, 100.0);
        t.charge(ben, 150.0);
        t.charge(cal, 50.0);
        t.charge(dan, 100.0);
        let fs = t.compute();
        let ranks: Vec<_> = [dan, ann, cal, ben]
            .iter()
            .map(|i| fs.get(*i).unwrap().rank.unwrap())
            .collect();
        assert_eq!(ranks, vec![4, 3, 2, 1]);
        assert!(close(
            fs.get(t.account("ai").unwrap()).unwrap().level_fs,
            (2.0 / 3.0) / 0.75
        ));
    }

    #[test]
    fn decay_halves_per_half_life() {
        assert!(close(decay(100.0, 3600, 3600), 50.0));
        assert!(close(decay(100.0, 7200, 3600), 25.0));
        assert_eq!(decay(100.0, 1_000, 0), 100.0);
        let mut t = AssocTree::new();
        let u = t.add_user("u", "root", 1).unwrap();
        t.charge(u, 80.0);
        t.decay_all(60, 60);
        assert!(close(t.own_usage(u), 40.0));
    }

    #[test]
    fn billing_weighs_gpus_most() {
        let w = BillingWeights::default();
        assert!(w.rate(0, 0, 1) > w.rate(8, 16 * 1024, 0));
        assert!(close(w.usage(2, 1024, 1, 10), (2.0 + 0.25 + 16.0) * 10.0));
    }

    #[test]
    fn bad_edits_change_nothing() {
        let mut t = AssocTree::new();
        t.add_account("a", "root", 1).unwrap();
        let u = t.add_user("u", "a", 1).unwrap();
        assert_eq!(
            t.add_account("a", "root", 1),
            Err(FairShareError::DuplicateAccount("a".into()))
        );
        assert!(matches!(
            t.add_user("u", "a", 1),
            Err(FairShareError::DuplicateUser { .. })
        ));
        assert!(matches!(
            t.add_user("w", "nope", 1),
            Err(FairShareError::UnknownAccount(_))
        ));
        assert!(matches!(
            t.add_user("has space", "a", 1),
            Err(FairShareError::BadName(..))
        ));
        assert_eq!(
            t.remove_account("a"),
            Err(FairShareError::AccountNotEmpty("a".into()))
        );
        assert_eq!(t.remove_account("root"), Err(FairShareError::RemoveRoot));
        assert_eq!(t.len(), 3);
        t.remove_user("u", "a").unwrap();
        t.remove_account("a").unwrap();
        assert!(t.is_empty());
        assert_eq!(t.compute().factor(u), 0.0);
    }

    #[test]
    fn walk_is_depth_first_in_creation_order() {
        let mut t = AssocTree::new();
        t.add_account("a", "root", 1).unwrap();
        t.add_account("b", "root", 1).unwrap();
        t.add_user("x", "a", 1).unwrap();
        t.add_user("y", "b", 1).unwrap();
        let names: Vec<_> = t
            .walk()
            .iter()
            .map(|(i, d)| format!("{}{}", d, t.name(*i)))
            .collect();
        assert_eq!(names, vec!["0root", "1a", "2x", "1b", "2y"]);
    }

    #[test]
    fn sshare_rows_name_accounts_and_users() {
        let mut t = AssocTree::new();
        t.add_account("a", "root", 3).unwrap();
        let u = t.add_user("ann", "a", 1).unwrap();
        t.charge(u, 5.0);
        let rows = sshare_rows(&t, &t.compute());
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.depth,
                    r.account.as_str(),
                    r.user.as_deref(),
                    r.share.fairshare,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "root", None, None),
                (1, "a", None, None),
                (2, "a", Some("ann"), Some(1.0))
            ]
        );
        assert_eq!(rows[1].share.raw_shares, 3);
        assert_eq!(rows[1].share.raw_usage, 5.0);
    }

    /// A random two-level tree: accounts with random shares, users with random
    /// shares and usage.
    fn arb_tree() -> impl Strategy<Value = (AssocTree, Vec<AssocIdx>)> {
        prop::collection::vec(
            (1u32..5, prop::collection::vec((0u32..4, 0u32..4), 1..5)),
            1..5,
        )
        .prop_map(|accounts| {
            let mut t = AssocTree::new();
            let mut users = Vec::new();
            for (ai, (shares, us)) in accounts.iter().enumerate() {
                let acct = format!("acct{ai}");
                t.add_account(&acct, "root", *shares).unwrap();
                for (ui, (ushares, usage)) in us.iter().enumerate() {
                    let u = t.add_user(&format!("u{ai}_{ui}"), &acct, *ushares).unwrap();
                    t.charge(u, f64::from(*usage) * 100.0);
                    users.push(u);
                }
            }
            (t, users)
        })
    }

    proptest! {
        /// Factors lie in (0, 1]; the best user gets exactly 1; no rank
        /// exceeds the user count.
        #[test]
        fn factors_are_ranks_over_users((t, users) in arb_tree()) {
            let fs = t.compute();
            let n = users.len() as u32;
            prop_assert_eq!(fs.user_count(), n);
            let mut best = 0.0_f64;
            for u in &users {
                let r = fs.get(*u).unwrap().rank.unwrap();
                prop_assert!(r >= 1 && r <= n);
                let f = fs.factor(*u);
                prop_assert!(f > 0.0 && f <= 1.0);
                best = best.max(f);
            }
            prop_assert_eq!(best, 1.0);
        }

        /// The Fair Tree guarantee: if sibling account A has a higher level
        /// fair share than B, every user of A outranks every user of B.
        #[test]
        fn higher_account_lf_means_all_its_users_rank_higher((t, _users) in arb_tree()) {
            let fs = t.compute();
            let accts = t.children(t.root()).to_vec();
            for &a in &accts {
                for &b in &accts {
                    let (la, lb) = (fs.get(a).unwrap().level_fs, fs.get(b).unwrap().level_fs);
                    if la > lb {
                        for &ua in t.children(a) {
                            for &ub in t.children(b) {
                                prop_assert!(fs.factor(ua) > fs.factor(ub));
                            }
                        }
                    }
                }
            }
        }

        /// Charging a user more never raises their factor.
        #[test]
        fn more_usage_never_helps((mut t, users) in arb_tree(), pick in 0usize..20, extra in 1u32..1000) {
            let u = users[pick % users.len()];
            let before = t.compute().factor(u);
            t.charge(u, f64::from(extra) * 1000.0);
            let after = t.compute().factor(u);
            prop_assert!(after <= before);
        }
    }

    #[test]
    fn names_reject_separators_controls_and_length() {
        for ok in ["a", "lab-1", "u_2.x", &"n".repeat(MAX_NAME_LEN)] {
            assert_eq!(check_name(ok), Ok(()), "{ok:?}");
        }
        for bad in ["", "a b", "a,b", "a|b", "a:b", "a\tb", "a\u{7}b", "a\nb"] {
            assert!(
                matches!(check_name(bad), Err(FairShareError::BadName(..))),
                "{bad:?}"
            );
        }
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let err = check_name(&long).unwrap_err().to_string();
        assert!(err.contains("longer than 64 bytes"), "{err}");
        // The message shows a prefix, not the whole oversized name.
        assert!(err.len() < 2 * MAX_NAME_LEN + 40, "{err}");
        let mut t = AssocTree::new();
        assert!(t.add_account("x|y", ROOT_ACCOUNT, 1).is_err());
        assert!(t.is_empty());
    }
}
