//! Usage: what an allocation costs ([`BillingWeights`]), charging it to an association and
//! refunding time a job did not run, half-life decay, and carrying usage over when the tree
//! is rebuilt from its lists after a restart.
//!
//! This is the part of the tree that changes with time rather than with `sacctmgr`; usage
//! is never negative (decay multiplies, charging adds, refunds stop at zero).

use serde::{Deserialize, Serialize};

use super::ROOT_ACCOUNT;
use super::tree::{AssocIdx, AssocKind, AssocTree};

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

impl AssocTree {
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
}
