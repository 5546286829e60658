//! Slurm's Fair Tree ranking (the algorithm is described in the parent module): per sibling
//! set the level fair share `LF = S / U`, the depth-first walk that hands out ranks with
//! Slurm's tie rules, and the resulting [`FairShareTable`] (the numbers `sshare` prints and
//! the factor per user association) that a pass computes once and reads per job.

use serde::{Deserialize, Serialize};

use super::tree::{AssocIdx, AssocKind, AssocTree};

impl AssocTree {
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
