//! Accounts, users and QOS (`sacctmgr`), and usage charging.

use crate::JobId;
use crate::account::{AccountConfig, UserConfig};
use crate::fairshare::{AssocIdx, FairShareError};
use crate::job::Job;
use crate::qos::{DEFAULT_QOS, Qos};
use crate::tres::Tres;

use super::{AccountingSnapshot, AdminError, State};

impl State {
    /// `sacctmgr add account`.
    pub fn add_account(&mut self, acct: AccountConfig) -> Result<(), AdminError> {
        let parent = acct
            .parent
            .clone()
            .unwrap_or_else(|| crate::fairshare::ROOT_ACCOUNT.to_string());
        self.assoc.add_account(&acct.name, &parent, acct.shares)?;
        self.config.accounts.push(acct);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr delete account` (must have no users or sub-accounts, and no jobs that
    /// have not ended).
    pub fn remove_account(&mut self, name: &str) -> Result<(), AdminError> {
        if self.assoc.account(name).is_some() {
            let active = self.active_jobs_charging(name, None);
            if active > 0 {
                return Err(AdminError::Invalid(format!(
                    "account {name} has {active} active job(s); cancel them first"
                )));
            }
        }
        self.assoc.remove_account(name)?;
        self.config.accounts.retain(|a| a.name != name);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify account set fairshare=.. GrpTRES=..`.
    pub fn modify_account(
        &mut self,
        name: &str,
        shares: Option<u32>,
        limits: Option<crate::account::AssocLimits>,
    ) -> Result<(), AdminError> {
        let idx = self
            .assoc
            .account(name)
            .ok_or_else(|| AdminError::Invalid(format!("account {name:?} does not exist")))?;
        if let Some(s) = shares {
            self.assoc.set_shares(idx, s);
        }
        if let Some(a) = self.config.accounts.iter_mut().find(|a| a.name == name) {
            if let Some(s) = shares {
                a.shares = s;
            }
            if let Some(l) = limits {
                a.limits = l;
            }
        } else if limits.is_some() {
            return Err(AdminError::Invalid("the root account has no limits".into()));
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr add user NAME account=A`. A user's first association is their default
    /// account; a new default takes the flag from the old one.
    pub fn add_user(&mut self, mut user: UserConfig) -> Result<(), AdminError> {
        self.assoc
            .add_user(&user.user, &user.account, user.shares)?;
        let first = !self.config.users.iter().any(|u| u.user == user.user);
        user.default |= first;
        if user.default {
            for u in self.config.users.iter_mut().filter(|u| u.user == user.user) {
                u.default = false;
            }
        }
        self.config.users.push(user);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify account set ...`: replaces an account's settings (shares, limits,
    /// description); its name and parent stay.
    pub fn update_account(&mut self, acct: AccountConfig) -> Result<(), AdminError> {
        let Some(idx) = self.assoc.account(&acct.name) else {
            return Err(FairShareError::UnknownAccount(acct.name).into());
        };
        let Some(cur) = self
            .config
            .accounts
            .iter_mut()
            .find(|a| a.name == acct.name)
        else {
            return Err(AdminError::Invalid(
                "the root account cannot be modified".into(),
            ));
        };
        if cur.parent != acct.parent {
            return Err(AdminError::Invalid(format!(
                "account {}: the parent cannot be changed",
                acct.name
            )));
        }
        self.assoc.set_shares(idx, acct.shares);
        *cur = acct;
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify user ... set ...`: replaces one association's settings. Making it
    /// the default takes the flag from the user's other associations.
    pub fn update_user(&mut self, user: UserConfig) -> Result<(), AdminError> {
        let Some(idx) = self.assoc.user(&user.user, &user.account) else {
            return Err(FairShareError::UnknownUser {
                user: user.user,
                account: user.account,
            }
            .into());
        };
        self.assoc.set_shares(idx, user.shares);
        for u in self.config.users.iter_mut().filter(|u| u.user == user.user) {
            if u.account == user.account {
                u.shares = user.shares;
                u.default = user.default;
            } else if user.default {
                u.default = false;
            }
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// Jobs not yet ended that charge `account` (only `user`'s, if given).
    pub fn active_jobs_charging(&self, account: &str, user: Option<&str>) -> usize {
        self.jobs
            .values()
            .filter(|j| !j.state.is_terminal() && j.spec.account == account)
            .filter(|j| user.is_none_or(|u| j.spec.user == u))
            .count()
    }

    /// What run-time account, user and QOS changes touch, to undo a request that fails
    /// part-way (`sacctmgr add account a,b` when `b` is bad adds neither).
    pub fn accounting_snapshot(&self) -> AccountingSnapshot {
        AccountingSnapshot {
            accounts: self.config.accounts.clone(),
            users: self.config.users.clone(),
            qos: self.config.qos.clone(),
            assoc: self.assoc.clone(),
            config_changed: self.changes.config,
            assoc_changed: self.changes.assoc,
        }
    }

    /// Puts back what [`State::accounting_snapshot`] saw.
    pub fn rollback_accounting(&mut self, snap: AccountingSnapshot) {
        self.config.accounts = snap.accounts;
        self.config.users = snap.users;
        self.config.qos = snap.qos;
        self.assoc = snap.assoc;
        self.changes.config = snap.config_changed;
        self.changes.assoc = snap.assoc_changed;
    }

    /// Marks the configuration and the account tree changed, so the controller persists
    /// them: on first start, this makes the store the authority from then on.
    pub fn mark_accounting_changed(&mut self) {
        self.changes.config = true;
        self.changes.assoc = true;
    }

    /// `sacctmgr delete user NAME account=A` (refused while the association has jobs that
    /// have not ended).
    pub fn remove_user(&mut self, user: &str, account: &str) -> Result<(), AdminError> {
        if self.assoc.user(user, account).is_some() {
            let active = self.active_jobs_charging(account, Some(user));
            if active > 0 {
                return Err(AdminError::Invalid(format!(
                    "user {user} has {active} active job(s) in account {account}; cancel them first"
                )));
            }
        }
        self.assoc.remove_user(user, account)?;
        self.config
            .users
            .retain(|u| !(u.user == user && u.account == account));
        let mut mine = self.config.users.iter_mut().filter(|u| u.user == user);
        if let Some(first) = mine.next()
            && !first.default
            && !mine.any(|u| u.default)
        {
            // The default went with the association: the next one takes over.
            if let Some(u) = self.config.users.iter_mut().find(|u| u.user == user) {
                u.default = true;
            }
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr add/modify qos`: inserts or replaces by name.
    pub fn upsert_qos(&mut self, qos: Qos) -> Result<(), AdminError> {
        for p in &qos.preempt {
            if p != &qos.name && self.config.qos(p).is_none() {
                return Err(AdminError::Invalid(format!(
                    "QOS {} preempts unknown QOS {p:?}",
                    qos.name
                )));
            }
        }
        match self.config.qos.iter_mut().find(|q| q.name == qos.name) {
            Some(q) => *q = qos,
            None => self.config.qos.push(qos),
        }
        self.changes.config = true;
        Ok(())
    }

    /// `sacctmgr delete qos` (not `normal`, not one jobs still use).
    pub fn remove_qos(&mut self, name: &str) -> Result<(), AdminError> {
        if name == DEFAULT_QOS {
            return Err(AdminError::Invalid(format!(
                "QOS {DEFAULT_QOS} cannot be removed"
            )));
        }
        if self
            .jobs
            .values()
            .any(|j| !j.state.is_terminal() && j.spec.qos == name)
        {
            return Err(AdminError::Invalid(format!("QOS {name} is used by jobs")));
        }
        let before = self.config.qos.len();
        self.config.qos.retain(|q| q.name != name);
        if self.config.qos.len() == before {
            return Err(AdminError::Invalid(format!("QOS {name:?} does not exist")));
        }
        for q in &mut self.config.qos {
            q.preempt.retain(|p| p != name);
        }
        self.changes.config = true;
        Ok(())
    }

    /// The association a job charges: its user under its account, else the account.
    pub fn job_assoc(&self, job: &Job) -> Option<AssocIdx> {
        self.assoc
            .user(&job.spec.user, &job.spec.account)
            .or_else(|| self.assoc.account(&job.spec.account))
    }

    /// Decays all usage to `now` and charges running jobs for the time since the last
    /// charge. Called at the start of each pass; job ends charge their final stretch.
    pub fn charge_usage(&mut self, now: i64) {
        let Some(last) = self.usage_charged_at else {
            self.usage_charged_at = Some(now);
            return;
        };
        if now <= last {
            return;
        }
        let elapsed = (now - last) as u64;
        self.assoc
            .decay_all(elapsed, self.config.fairshare.half_life_s);
        let running: Vec<JobId> = self.running.iter().copied().collect();
        for id in running {
            let job = &self.jobs[&id];
            let from = job.start_time.unwrap_or(now).max(last);
            self.charge(job.id, from, now);
        }
        self.usage_charged_at = Some(now);
        self.changes.assoc = true;
    }

    /// Settles a job's usage when it ends at `end`: charges its last stretch (since the
    /// last periodic charge), or, when a periodic charge already ran past `end` (the end
    /// was reported late: a controller restart, a worker or a bridge that told it after a
    /// pass), gives back what was charged for time the job did not run. Usage then equals
    /// what `sacct` shows it ran. The refund is not decayed: the periods involved are
    /// seconds against a half-life of days.
    pub(super) fn charge_job(&mut self, id: JobId, end: i64) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let last = self.usage_charged_at.unwrap_or(i64::MIN);
        let start = job.start_time.unwrap_or(end);
        if end >= last {
            self.charge(id, start.max(last), end);
        } else {
            self.refund(id, end.max(start), last);
        }
        self.changes.assoc = true;
    }

    /// Settles the usage of one part of a running job's allocation that leaves it at `end`
    /// while the rest runs on (a placeholder handing back a node): as [`Self::charge_job`],
    /// for `part` only. Call before the part leaves the allocation; the periodic charge
    /// bills the rest from then on.
    pub(super) fn charge_part(&mut self, id: JobId, part: &Tres, end: i64) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let last = self.usage_charged_at.unwrap_or(i64::MIN);
        let start = job.start_time.unwrap_or(end);
        let Some(idx) = self.job_assoc(job) else {
            return;
        };
        if end >= last {
            if let Some(usage) = self.usage_of(part, start.max(last), end) {
                self.assoc.charge(idx, usage);
            }
        } else if let Some(usage) = self.usage_of(part, end.max(start), last) {
            self.assoc.refund(idx, usage);
        }
        self.changes.assoc = true;
    }

    fn charge(&mut self, id: JobId, from: i64, to: i64) {
        if let Some((idx, usage)) = self.usage_between(id, from, to) {
            self.assoc.charge(idx, usage);
        }
    }

    fn refund(&mut self, id: JobId, from: i64, to: i64) {
        if let Some((idx, usage)) = self.usage_between(id, from, to) {
            self.assoc.refund(idx, usage);
        }
    }

    /// The job's billed usage from `from` to `to`, and the association it goes to.
    fn usage_between(&self, id: JobId, from: i64, to: i64) -> Option<(AssocIdx, f64)> {
        let job = self.jobs.get(&id)?;
        let t = job.alloc.as_deref()?.total();
        Some((self.job_assoc(job)?, self.usage_of(&t, from, to)?))
    }

    /// What holding `t` from `from` to `to` bills, by the configured weights.
    fn usage_of(&self, t: &Tres, from: i64, to: i64) -> Option<f64> {
        if to <= from {
            return None;
        }
        let usage = self.config.fairshare.billing.usage(
            u64::from(t.cpus),
            t.mem_mb,
            u64::from(t.gpus),
            (to - from) as u64,
        );
        Some(usage)
    }
}
