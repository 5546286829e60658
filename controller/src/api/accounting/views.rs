//! The accounting views: `sacctmgr show account/user/assoc/qos`, `sshare` and `sprio`, read
//! from `State` into their wire rows. Pure functions of `State` (and `now`): the handlers run
//! them on the state actor through `Handle::read`, which answers at once, nothing committed.
use std::collections::{HashMap, HashSet};

use tandem_proto::v1;
use tandem_sched::State;
use tandem_sched::account::{AccountConfig, AssocLimits};
use tandem_sched::fairshare::{AssocKind, sshare_rows};
use tandem_sched::job::{JobState, PreemptMode, Reason};
use tandem_sched::ranking::Ranking;

fn limits_to_proto(l: &AssocLimits) -> v1::AssocLimits {
    v1::AssocLimits {
        grp_gpus: l.grp_gpus,
        grp_jobs: l.grp_jobs,
        max_jobs_per_user: l.max_jobs_per_user,
    }
}

/// `sacctmgr show account/user/assoc`: accounts and users in tree order (root first,
/// parents before children).
pub fn associations(st: &State) -> v1::ListAssociationsResponse {
    let tree = st.assoc();
    let cfg = st.config();
    // By name first: a walk over thousands of associations must not scan the lists per row.
    let by_name: HashMap<&str, &AccountConfig> =
        cfg.accounts.iter().map(|a| (a.name.as_str(), a)).collect();
    let defaults: HashSet<(&str, &str)> = cfg
        .users
        .iter()
        .filter(|u| u.default)
        .map(|u| (u.user.as_str(), u.account.as_str()))
        .collect();
    let mut accounts = Vec::new();
    let mut users = Vec::new();
    for (idx, _) in tree.walk() {
        let name = tree.name(idx);
        match tree.kind(idx) {
            AssocKind::Account => {
                let parent = tree
                    .parent(idx)
                    .map(|p| tree.name(p).to_owned())
                    .unwrap_or_default();
                let info = match by_name.get(name) {
                    Some(a) => v1::AccountInfo {
                        name: a.name.clone(),
                        parent,
                        shares: a.shares,
                        limits: Some(limits_to_proto(&a.limits)),
                        description: a.description.clone(),
                        organization: a.organization.clone(),
                    },
                    None => v1::AccountInfo {
                        name: name.to_owned(),
                        parent,
                        shares: tree.shares(idx),
                        limits: Some(v1::AssocLimits::default()),
                        ..Default::default()
                    },
                };
                accounts.push(info);
            }
            AssocKind::User => {
                let account = tree
                    .parent(idx)
                    .map(|p| tree.name(p).to_owned())
                    .unwrap_or_default();
                let is_default = defaults.contains(&(name, account.as_str()));
                users.push(v1::UserAssocInfo {
                    user: name.to_owned(),
                    account,
                    shares: tree.shares(idx),
                    is_default,
                });
            }
        }
    }
    v1::ListAssociationsResponse {
        cluster_name: cfg.cluster_name.clone(),
        accounts,
        users,
    }
}

/// `sacctmgr show qos`.
pub fn qos_list(st: &State) -> v1::ListQosResponse {
    let qos = st
        .config()
        .qos
        .iter()
        .map(|q| v1::QosInfo {
            name: q.name.clone(),
            priority: q.priority,
            preempt: q.preempt.clone(),
            preempt_mode: match q.preempt_mode {
                PreemptMode::Requeue => "requeue",
                PreemptMode::Cancel => "cancel",
            }
            .to_owned(),
            grace_time_s: q.grace_time_s,
            limits: Some(v1::QosLimits {
                max_jobs_per_user: q.limits.max_jobs_per_user,
                max_submit_per_user: q.limits.max_submit_per_user,
                max_jobs_per_account: q.limits.max_jobs_per_account,
                max_submit_per_account: q.limits.max_submit_per_account,
                max_gpus_per_user: q.limits.max_gpus_per_user,
                max_wall_s: q.limits.max_wall,
            }),
        })
        .collect();
    v1::ListQosResponse { qos }
}

/// `sshare -a -l`: every association with the numbers the last pass ranked by (usage is
/// charged at the start of each pass).
pub fn shares(st: &State) -> v1::ListSharesResponse {
    let table = st.assoc().compute();
    let rows = sshare_rows(st.assoc(), &table);
    let total = rows.first().map_or(0.0, |r| r.share.raw_usage);
    let rows = rows
        .into_iter()
        .map(|r| v1::ShareRow {
            depth: r.depth as u32,
            account: r.account,
            user: r.user.unwrap_or_default(),
            raw_shares: r.share.raw_shares,
            norm_shares: r.share.norm_shares,
            raw_usage: r.share.raw_usage,
            norm_usage: if total > 0.0 {
                r.share.raw_usage / total
            } else {
                0.0
            },
            effective_usage: r.share.effective_usage,
            level_fs: r.share.level_fs,
            fairshare: r.share.fairshare,
        })
        .collect();
    v1::ListSharesResponse { rows }
}

/// `sprio`: the factors of every pending job that is not held, at `now`.
pub fn priorities(
    st: &State,
    req: &v1::ListPrioritiesRequest,
    now: i64,
) -> v1::ListPrioritiesResponse {
    let cfg = &st.config().priority;
    let w = cfg.weights;
    let mut ranking = Ranking::new(st, now);
    // Sets first: the filters are checked once per pending job.
    let ids: HashSet<u64> = req.jobs.iter().copied().collect();
    let users: HashSet<&str> = req.users.iter().map(String::as_str).collect();
    let task_set: HashSet<(u64, u32)> = req
        .tasks
        .iter()
        .map(|t| (t.array_job_id, t.task_id))
        .collect();
    let mut tasks: HashMap<u64, Vec<u32>> = HashMap::new();
    for &(array, task) in &task_set {
        tasks.entry(array).or_default().push(task);
    }
    for v in tasks.values_mut() {
        v.sort_unstable();
    }
    let any_job = ids.is_empty() && tasks.is_empty();
    let mut rows = Vec::new();
    for job in st.unheld_pending_jobs() {
        if job.state != JobState::Pending {
            continue;
        }
        // Slurm's sprio leaves out jobs not yet eligible: a dependency or a begin time to
        // wait for (their priority still shows in squeue).
        if matches!(
            job.reason,
            Reason::Dependency | Reason::DependencyNeverSatisfied | Reason::BeginTime
        ) {
            continue;
        }
        if !users.is_empty() && !users.contains(job.spec.user.as_str()) {
            continue;
        }
        let id = job.id.0;
        let array_id = job.array_job_id.map(|a| a.0);
        let whole = match (&job.array, array_id, job.array_task_id) {
            (Some(a), _, _) => format!("{id}_[{}]", a.pending),
            (None, Some(meta), Some(task)) => format!("{meta}_{task}"),
            _ => id.to_string(),
        };
        let displays: Vec<String> =
            if any_job || ids.contains(&id) || array_id.is_some_and(|a| ids.contains(&a)) {
                vec![whole]
            } else if let Some(a) = &job.array {
                // The array's unstarted tasks share this one record: a row per task asked for.
                tasks
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .filter(|t| a.pending.contains(**t))
                    .map(|t| format!("{id}_{t}"))
                    .collect()
            } else {
                match (array_id, job.array_task_id) {
                    (Some(meta), Some(task)) if task_set.contains(&(meta, task)) => {
                        vec![whole]
                    }
                    _ => Vec::new(),
                }
            };
        if displays.is_empty() {
            continue;
        }
        let b = ranking.breakdown(job);
        let f = b.factors;
        for display_id in displays {
            rows.push(v1::PriorityRow {
                job_id: id,
                display_id,
                partition: job.spec.partition.clone(),
                user: job.spec.user.clone(),
                account: job.spec.account.clone(),
                qos: job.spec.qos.clone(),
                priority: job.spec.priority.unwrap_or(u64::from(b.total)),
                normalized: Some(v1::PriorityFactors {
                    age: f.age,
                    fairshare: f.fairshare,
                    job_size: f.job_size,
                    partition: f.partition,
                    qos: f.qos,
                    tres_cpu: f.tres_cpu,
                    tres_mem: f.tres_mem,
                    tres_gpu: f.tres_gpu,
                }),
                weighted: Some(v1::PriorityFactors {
                    age: b.age,
                    fairshare: b.fairshare,
                    job_size: b.job_size,
                    partition: b.partition,
                    qos: b.qos,
                    tres_cpu: f64::from(w.tres_cpu) * f.tres_cpu,
                    tres_mem: f64::from(w.tres_mem) * f.tres_mem,
                    tres_gpu: f64::from(w.tres_gpu) * f.tres_gpu,
                }),
                nice: b.nice,
                fixed: job.spec.priority.is_some(),
            });
        }
    }
    v1::ListPrioritiesResponse {
        weights: Some(v1::PriorityWeights {
            age: w.age,
            fairshare: w.fairshare,
            job_size: w.job_size,
            partition: w.partition,
            qos: w.qos,
            tres_cpu: w.tres_cpu,
            tres_mem: w.tres_mem,
            tres_gpu: w.tres_gpu,
        }),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use tandem_sched::account::UserConfig;
    use tandem_sched::job::JobSpec;

    use super::*;

    fn cluster() -> State {
        State::test_cluster(1, 4, 8_000, 0)
    }

    fn ids(resp: &v1::ListPrioritiesResponse) -> Vec<String> {
        let mut v: Vec<String> = resp.rows.iter().map(|r| r.display_id.clone()).collect();
        v.sort();
        v
    }

    fn task(array_job_id: u64, task_id: u32) -> v1::ArrayTaskRef {
        v1::ArrayTaskRef {
            array_job_id,
            task_id,
        }
    }

    #[test]
    fn sprio_filters_by_job_user_and_single_array_task() {
        let mut st = cluster();
        let one = st.submit(JobSpec::test(), 0).unwrap().0;
        let bobs = st.submit(JobSpec::test().user("bob"), 0).unwrap().0;
        let arr = st.submit(JobSpec::test().array("0-5"), 0).unwrap().0;
        let ask = |req: v1::ListPrioritiesRequest| ids(&priorities(&st, &req, 10));
        assert_eq!(ask(Default::default()).len(), 3);
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                users: vec!["bob".into()],
                ..Default::default()
            }),
            [bobs.to_string()]
        );
        // The whole array by its id; one task (asked twice) by `id_task`; a task the
        // array does not have matches nothing.
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                jobs: vec![arr],
                ..Default::default()
            }),
            [format!("{arr}_[0-5]")]
        );
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                tasks: vec![task(arr, 3), task(arr, 9), task(arr, 3)],
                ..Default::default()
            }),
            [format!("{arr}_3")]
        );
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                jobs: vec![one],
                tasks: vec![task(arr, 1), task(one, 1)],
                ..Default::default()
            }),
            [one.to_string(), format!("{arr}_1")]
        );
        // Filters combine with AND: bob has no array task.
        assert!(
            ask(v1::ListPrioritiesRequest {
                users: vec!["bob".into()],
                tasks: vec![task(arr, 1)],
                ..Default::default()
            })
            .is_empty()
        );
    }

    /// Slurm 22.05: `sprio -j` of a job waiting for a dependency or a begin time, or held,
    /// says "Unable to find jobs matching user/id(s) specified"; squeue shows its priority.
    #[test]
    fn sprio_leaves_out_jobs_not_yet_eligible() {
        let mut st = cluster();
        let running = st.submit(JobSpec::test().cpus_per_task(4), 0).unwrap();
        let waits = st.submit(JobSpec::test(), 0).unwrap();
        let after = st
            .submit(
                JobSpec::test().dependency(&format!("afterok:{}", running.0)),
                0,
            )
            .unwrap();
        let later = st.submit(JobSpec::test().begin(3_600), 0).unwrap();
        st.submit(JobSpec::test().held(), 0).unwrap();
        st.schedule(1);
        let job = |id| st.job(id).unwrap();
        assert_eq!(job(after).reason, Reason::Dependency);
        assert_eq!(job(later).reason, Reason::BeginTime);
        assert!(job(after).priority > 0 && job(later).priority > 0);
        assert_eq!(
            ids(&priorities(&st, &Default::default(), 10)),
            [waits.0.to_string()]
        );
    }

    #[test]
    fn associations_keep_settings_and_default_accounts() {
        let mut st = cluster();
        let mut acct = AccountConfig::new("phys", 3);
        acct.description = "physics".into();
        st.add_account(acct).unwrap();
        st.add_account(AccountConfig {
            parent: Some("phys".into()),
            ..AccountConfig::new("astro", 1)
        })
        .unwrap();
        for (account, default) in [("phys", false), ("astro", true)] {
            st.add_user(UserConfig {
                user: "alice".into(),
                account: account.into(),
                shares: 1,
                default,
            })
            .unwrap();
        }
        let resp = associations(&st);
        let phys = resp.accounts.iter().find(|a| a.name == "phys").unwrap();
        assert_eq!((phys.shares, phys.description.as_str()), (3, "physics"));
        let astro = resp.accounts.iter().find(|a| a.name == "astro").unwrap();
        assert_eq!(astro.parent, "phys");
        let mut defaults: Vec<(&str, bool)> = resp
            .users
            .iter()
            .map(|u| (u.account.as_str(), u.is_default))
            .collect();
        defaults.sort();
        assert_eq!(defaults, [("astro", true), ("phys", false)]);
    }
}
