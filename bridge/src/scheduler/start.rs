//! Turning a target's decision into an operation: [`Loop::start`] gathers what the
//! decision needs (the group's owner, read once through a [`Work::Lookup`]; its members,
//! ghosts included; its placeholder as the book sees it), asks [`decide_gang`], and builds
//! the [`Work`] that applies the answer, one method per kind of decision.
//!
//! Kept apart from the loop's plumbing ([`super`]) and from the watch reactions
//! ([`super::watch`]): deciding is pure ([`crate::decide`]); what is here is the
//! bookkeeping around it (owners, expected sizes, staged groups, what each pod was told)
//! and the checks made against the Nodes as they are now (a bind onto a node that no
//! longer fits, the nodes a submit must exclude). Nothing here calls the API server or the
//! controller; [`super::work`] does.

use std::ops::ControlFlow;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use tracing::{debug, warn};

use super::work::{self, Tell, Work};
use super::{Ghost, Loop, PlaceholderId, Target, pod_key};
use crate::batch::BatchAlloc;
use crate::decide::{
    Decision, EndReason, Member, MemberState, decide_gang, member_state, vanished_state,
};
use crate::group::{self, GroupInfo, GroupKey, GroupKind, WorkloadPolicy, expected_members};
use crate::{annotations, apply, fit, policy, resources};

/// What a group's decision starts from, once its owner is read: its placeholder's key
/// (when its UID is known) and the owner object.
type Identified = (Option<PlaceholderId>, Option<serde_json::Value>);

impl<B: BatchAlloc> Loop<B> {
    /// Decides one target; the operation that applies the decision, if any. `Err` = try
    /// again later.
    pub(super) fn start(&mut self, t: &Target, now: i64) -> Result<Option<Work>, String> {
        let (key, uid, owner) = match t {
            Target::Group(k) => match self.identify(k) {
                ControlFlow::Continue((id, owner)) => (Some(k.clone()), id, owner),
                ControlFlow::Break(w) => return Ok(w),
            },
            Target::Orphan(id) => {
                self.check_orphan(id)?;
                (None, Some(id.clone()), None)
            }
        };
        let pods: Vec<Pod> = key.as_ref().map(|k| self.ix.pods_of(k)).unwrap_or_default();
        let ghosts: Vec<Ghost> = key
            .as_ref()
            .map(|k| self.ix.ghosts(k).to_vec())
            .unwrap_or_default();
        if let Some(k) = &key
            && pods.is_empty()
            && ghosts.is_empty()
            && uid.as_ref().is_none_or(|u| !self.book.has_job(u))
        {
            self.forget(k);
            return Ok(None);
        }
        let members = self.members(key.as_ref(), &pods, &ghosts, now);
        let release = releasable(&pods, &members);
        let view = self.book.view(uid.as_ref());
        let expected = match &key {
            Some(k) => self.expected_of(k, &pods, owner.as_ref()),
            None => Some(0),
        };
        if let (Some(k), Some(o)) = (&key, owner.as_ref()) {
            self.note_staged(k, &pods, o);
        }
        let staged = key.as_ref().is_some_and(|k| self.staged.contains_key(k));
        let ns = match (&key, &uid) {
            (Some(k), _) => k.namespace.clone(),
            (None, Some(id)) => id.namespace.clone(),
            (None, None) => String::new(),
        };
        let work = match decide_gang(&members, expected, staged, &view, now) {
            Decision::Wait { why } => {
                debug!(target = ?t, why, "waiting");
                None
            }
            Decision::Submit => self.submit_op(key, uid, pods)?,
            Decision::Unschedulable {
                pods: names,
                message,
            } => self.tell_op(&ns, &names, &pods, message),
            Decision::Bind { job_id, bindings } => {
                // Never bind where the kubelet would reject the pod: a node's labels or
                // taints may have changed since the placeholder was submitted. Such a job
                // ends, and the group is submitted again with the nodes it may use.
                if self.no_longer_fits(job_id, &bindings, &pods) {
                    return Ok(Some(Work::End {
                        ns,
                        job_id,
                        end_time: now,
                        release,
                    }));
                }
                Some(self.bind_op(ns, job_id, bindings, pods)?)
            }
            Decision::Evict {
                job_id,
                pods: names,
                why,
            } => Some(self.evict_op(ns, job_id, names, &pods, why, now)?),
            Decision::EndJob { job_id, end_time } => {
                return Ok(Some(Work::End {
                    ns,
                    job_id,
                    end_time,
                    release,
                }));
            }
            Decision::ReleaseNodes {
                job_id,
                nodes,
                end_time,
            } => {
                return Ok(Some(Work::ReleaseNodes {
                    ns,
                    job_id,
                    nodes,
                    end_time,
                    release,
                }));
            }
        };
        Ok(self.with_release(t, work, release))
    }

    /// A group's placeholder key and its owner, read once: `Break` with the owner's lookup
    /// when it is not read yet, or with what a Workload's says to do instead of deciding
    /// the group as a gang.
    fn identify(&mut self, k: &GroupKey) -> ControlFlow<Option<Work>, Identified> {
        let owner = self.owners.remove(k);
        let needs_owner = match k.kind {
            GroupKind::Workload
            | GroupKind::PodGroup
            | GroupKind::JobSet
            | GroupKind::IndexedJob => self.book.uid(k).is_none() || !self.expected.contains_key(k),
            // Read once, for its startup policy: a LeaderReady set makes its workers only
            // once the leader runs.
            GroupKind::LeaderWorkerSet => !self.owner_read.contains(k),
            GroupKind::Pod => false,
        };
        if needs_owner && owner.is_none() {
            return ControlFlow::Break(Some(Work::Lookup(k.clone(), self.owner_name(k))));
        }
        if owner.is_some() {
            self.owner_read.insert(k.clone());
        }
        if k.kind == GroupKind::Workload
            && let Some(read) = &owner
            && let Some(w) = self.workload_gate(k, read.as_ref())
        {
            return ControlFlow::Break(w);
        }
        let owner = owner.flatten();
        let id = self
            .uid_of(k, owner.as_ref())
            .map(|u| PlaceholderId::new(&k.namespace, &u));
        ControlFlow::Continue((id, owner))
    }

    /// `Err` while a group of the orphan's namespace whose UID is still unknown (its
    /// PodGroup not read yet) may own it: fail closed rather than end a running group's
    /// job. Groups of other namespaces never own it.
    fn check_orphan(&self, id: &PlaceholderId) -> Result<(), String> {
        if self
            .ix
            .groups_in(&id.namespace)
            .any(|k| self.book.uid(k).is_none())
        {
            return Err("a group's UID is still unknown".into());
        }
        Ok(())
    }

    /// The group's members as the decision sees them: its pods, and the ghosts of those
    /// that vanished holding their slot. A ghost past its deadline counts as stopped in
    /// this decision, then is dropped.
    fn members(
        &mut self,
        key: Option<&GroupKey>,
        pods: &[Pod],
        ghosts: &[Ghost],
        now: i64,
    ) -> Vec<Member> {
        let mut members: Vec<Member> = pods.iter().map(|p| self.member(p, now)).collect();
        members.extend(ghosts.iter().map(|g| Member {
            name: g.name.clone(),
            rank: g.rank,
            node: Some(g.node.clone()),
            state: vanished_state(g.deadline, now),
        }));
        if let Some(k) = key {
            self.ix.drop_due_ghosts(k, now);
        }
        members
    }

    /// `Decision::Submit`: the submit of the group's placeholder (or the `Unschedulable`
    /// its request earns). An orphan, or a group whose UID is unknown, submits nothing.
    fn submit_op(
        &self,
        key: Option<GroupKey>,
        uid: Option<PlaceholderId>,
        pods: Vec<Pod>,
    ) -> Result<Option<Work>, String> {
        Ok(match (key, uid) {
            // Which nodes the pods may use is judged from the pool's node list: wait for
            // its first read rather than submit without it.
            (Some(_), Some(_)) if self.modes.is_none() => {
                return Err("the pool's nodes are not read yet".into());
            }
            (Some(k), Some(id)) => Some(self.submit(k, id.uid, pods)),
            _ => None,
        })
    }

    /// `Decision::Unschedulable` (and a Workload that cannot be read): tell the pods named
    /// why they wait, unless every one of them was told `message` already.
    fn tell_op(&self, ns: &str, names: &[String], pods: &[Pod], message: String) -> Option<Work> {
        let tell = self.tell(ns, names, pods);
        let fresh = tell
            .pods
            .iter()
            .any(|p| tell.told.get(&pod_key(p).1) != Some(&message));
        fresh.then_some(Work::Tell { tell, message })
    }

    /// Whether an allocated node of `job_id` no longer fits the pods bound to it (said in
    /// the log): the job is then ended, to place them again.
    fn no_longer_fits(&self, job_id: u64, bindings: &[(String, String)], pods: &[Pod]) -> bool {
        let Some(why) = self.misfit(bindings, pods) else {
            return false;
        };
        warn!(
            job_id,
            why,
            "allocated node no longer fits the pods; ending the placeholder to place them again"
        );
        true
    }

    /// `Decision::Bind`: bind the pods named, once every node is one they may go to now.
    /// `Err` until each Node is written to kube mode and its GPU holder has stopped.
    fn bind_op(
        &self,
        ns: String,
        job_id: u64,
        bindings: Vec<(String, String)>,
        pods: Vec<Pod>,
    ) -> Result<Work, String> {
        if let Some(why) =
            (bindings.iter()).find_map(|(_, n)| self.holders.unbindable(self.node_objs.get(n)?))
        {
            return Err(why);
        }
        let pods = pods
            .into_iter()
            .filter(|p| bindings.iter().any(|(n, _)| *n == pod_key(p).1))
            .collect();
        Ok(Work::Bind {
            ns,
            job_id,
            bindings,
            pods,
        })
    }

    /// `Decision::Evict`: evict the pods named. A refused eviction is tried again with
    /// backoff, and past the timeout the pod is deleted: a PodDisruptionBudget must not
    /// hold a scancel, a preemption or a time limit forever ([`super::refusals`]). `Err`
    /// while every eviction backs off.
    fn evict_op(
        &self,
        ns: String,
        job_id: u64,
        names: Vec<String>,
        pods: &[Pod],
        why: EndReason,
        now: i64,
    ) -> Result<Work, String> {
        let timeout_s = self.cfg.eviction_timeout_s;
        let plan = self.refusals.plan(&ns, names, now, timeout_s);
        if plan.backs_off() {
            return Err("evictions refused by a PodDisruptionBudget; backing off".into());
        }
        let overdue = (plan.overdue.iter())
            .flat_map(|n| pods.iter().filter(move |p| pod_key(p).1 == *n))
            .cloned()
            .collect();
        Ok(Work::Evict {
            ns,
            job_id,
            names: plan.evict,
            overdue,
            why,
            timeout_s,
        })
    }

    /// The operation with the pods to `release`: on their own when there is nothing else
    /// to do, else once the operation is done and the group is decided again.
    fn with_release(&mut self, t: &Target, work: Option<Work>, release: Vec<Pod>) -> Option<Work> {
        match work {
            None if !release.is_empty() => Some(Work::Release(release)),
            Some(w) => {
                if !release.is_empty() {
                    // Released once this operation is done and the group is decided again.
                    self.retry.insert(t.clone());
                }
                Some(w)
            }
            None => None,
        }
    }

    /// Records whether the group's owner, just read, starts it in stages, with every
    /// member's requests. Templates whose requests cannot be read leave it a plain gang
    /// (whose pods are then told why, when they are submitted).
    fn note_staged(&mut self, k: &GroupKey, pods: &[Pod], owner: &serde_json::Value) {
        let Some(info) = pods.first().and_then(|p| self.ix.info(&pod_key(p))) else {
            return;
        };
        let Some(specs) = group::staged_members(info, Some(owner)) else {
            self.staged.remove(k);
            return;
        };
        match specs
            .iter()
            .map(resources::pod_resources)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(all) => {
                self.staged.insert(k.clone(), all);
            }
            Err(e) => debug!(group = ?k, error = %e, "staged group's templates unreadable"),
        }
    }

    /// The owner's name when the group's key is not it: a LeaderWorkerSet's, from its pods.
    fn owner_name(&self, k: &GroupKey) -> Option<String> {
        if k.kind != GroupKind::LeaderWorkerSet {
            return None;
        }
        self.ix.pods_of(k).iter().find_map(|p| {
            p.metadata
                .labels
                .as_ref()?
                .get(crate::labels::LWS_NAME)
                .cloned()
        })
    }

    fn forget(&mut self, k: &GroupKey) {
        self.ix.forget(k);
        self.staged.remove(k);
        self.owner_read.remove(k);
        self.expected.remove(k);
        self.owners.remove(k);
        self.book.unlink(k);
    }

    pub(super) fn member(&self, p: &Pod, now: i64) -> Member {
        let key = pod_key(p);
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let gone = node.as_ref().and_then(|n| self.gone.get(n).copied());
        Member {
            rank: self.ix.info(&key).and_then(|i| i.rank),
            name: key.1,
            state: member_state(p, gone, self.cfg.node_grace_s, now),
            node,
        }
    }

    /// A Workload group just read: `None` to decide it as a gang; else what to do instead.
    /// A `basic` pod group's pods are regrouped one by one. A missing or unusable Workload
    /// leaves the pods waiting, told why, and is read again each tick (kube-scheduler too
    /// keeps them unschedulable until the Workload appears), never placed one by one.
    fn workload_gate(
        &mut self,
        k: &GroupKey,
        workload: Option<&serde_json::Value>,
    ) -> Option<Option<Work>> {
        match group::workload_group(k, workload) {
            Ok(g) if g.policy == WorkloadPolicy::Basic => {
                let pods = self.ix.make_basic(k);
                self.forget(k);
                for p in pods {
                    self.upsert(p);
                }
                Some(None)
            }
            Ok(_) => None,
            Err(e) => {
                self.retry.insert(Target::Group(k.clone()));
                let waiting: Vec<Pod> = self
                    .ix
                    .pods_of(k)
                    .into_iter()
                    .filter(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
                    })
                    .collect();
                let names: Vec<String> = waiting.iter().map(|p| pod_key(p).1).collect();
                Some(self.tell_op(&k.namespace, &names, &waiting, e.to_string()))
            }
        }
    }

    /// The group's UID: on the pods where they carry it, else from its owner object.
    fn uid_of(&mut self, k: &GroupKey, owner: Option<&serde_json::Value>) -> Option<String> {
        if let Some(u) = self.book.uid(k) {
            return Some(u.clone());
        }
        let uid = group::owner_uid(k, owner)?;
        self.book.link(k, uid.clone());
        Some(uid)
    }

    fn expected_of(
        &mut self,
        k: &GroupKey,
        pods: &[Pod],
        owner: Option<&serde_json::Value>,
    ) -> Option<u32> {
        if let Some(n) = self.expected.get(k) {
            return Some(*n);
        }
        let info = pods.first().and_then(|p| self.ix.info(&pod_key(p)))?;
        let n = expected_members(info, owner)?;
        self.expected.insert(k.clone(), n);
        Some(n)
    }

    /// The submit of a group's placeholder, or the `Unschedulable` its request earns.
    fn submit(&self, k: GroupKey, uid: String, pods: Vec<Pod>) -> Work {
        let waiting: Vec<Pod> = pods
            .into_iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
            .collect();
        let names: Vec<String> = waiting.iter().map(|p| pod_key(p).1).collect();
        let tell = self.tell(&k.namespace, &names, &waiting);
        let request = self
            .request(&k, &tell.pods)
            .and_then(|r| Ok((r, self.exclusions(&tell.pods)?)));
        match request {
            Ok(((info, res, settings), exclude)) => Work::Submit(Box::new(work::Submit {
                key: k,
                uid,
                info,
                res,
                settings,
                exclude,
                waiting: tell,
            })),
            Err(message) => Work::Tell { tell, message },
        }
    }

    /// The pool nodes `pods` may not run on (their nodeSelector, required node affinity,
    /// or a taint they do not tolerate; or no Kubernetes Node to bind to). `Err` when a pod
    /// cannot be placed anywhere, saying why.
    fn exclusions(&self, pods: &[Pod]) -> Result<Vec<String>, String> {
        let specs: Vec<&PodSpec> = pods.iter().filter_map(|p| p.spec.as_ref()).collect();
        if let Some(why) = specs.iter().find_map(|s| fit::unplaceable(s)) {
            return Err(why);
        }
        let Some(modes) = &self.modes else {
            return Err("the pool's nodes are not read yet".into());
        };
        let mut names: Vec<&String> = modes.keys().collect();
        names.sort();
        let mut out = Vec::new();
        let mut first_why = None;
        for name in names {
            let why = match self.node_objs.get(name) {
                None => Some(format!("node {name} has no Kubernetes Node")),
                Some(n) => specs.iter().find_map(|s| fit::fits(s, n).err()),
            };
            if let Some(why) = why {
                first_why.get_or_insert(why);
                out.push(name.clone());
            }
        }
        if !modes.is_empty() && out.len() == modes.len() {
            return Err(format!(
                "no pool node fits the pod: {}",
                first_why.unwrap_or_default()
            ));
        }
        Ok(out)
    }

    /// Why a binding would put a pod where the kubelet rejects it, if it would.
    fn misfit(&self, bindings: &[(String, String)], pods: &[Pod]) -> Option<String> {
        bindings.iter().find_map(|(pod, node)| {
            let spec = pods.iter().find(|p| pod_key(p).1 == *pod)?.spec.as_ref()?;
            match self.node_objs.get(node) {
                None => Some(format!("node {node} has no Kubernetes Node")),
                Some(n) => fit::fits(spec, n).err(),
            }
        })
    }

    /// What the placeholder request needs that the loop knows.
    fn request(
        &self,
        k: &GroupKey,
        pods: &[Pod],
    ) -> Result<(GroupInfo, Vec<resources::PodResources>, policy::Resolved), String> {
        let first = pods.first().ok_or("no pod waits")?;
        let asks =
            annotations::parse(first.metadata.annotations.as_ref()).map_err(|e| e.to_string())?;
        let settings =
            policy::resolve(&k.namespace, &asks, &self.policies).map_err(|e| e.to_string())?;
        if let Some(all) = self.staged.get(k) {
            // Sized for every member, the later stages included.
            let info = self
                .ix
                .info(&pod_key(first))
                .ok_or("pod not grouped")?
                .clone();
            return Ok((info, all.clone(), settings));
        }
        let res: Vec<resources::PodResources> = pods
            .iter()
            .map(|p| {
                p.spec
                    .as_ref()
                    .map(resources::pod_resources)
                    .unwrap_or(Ok(resources::PodResources::default()))
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let info = self
            .ix
            .info(&pod_key(first))
            .ok_or("pod not grouped")?
            .clone();
        Ok((info, res, settings))
    }

    /// The pods named, with what each was last told.
    fn tell(&self, ns: &str, names: &[String], pods: &[Pod]) -> Tell {
        let pods: Vec<Pod> = pods
            .iter()
            .filter(|p| names.contains(&pod_key(p).1))
            .cloned()
            .collect();
        let told = pods
            .iter()
            .filter_map(|p| {
                let key = pod_key(p);
                self.told.get(&key).map(|m| (key.1, m.clone()))
            })
            .collect();
        Tell {
            ns: ns.to_owned(),
            pods,
            told,
        }
    }
}

/// Pods whose slot is free (stopped, as the kubelet reported) but still carry the slot
/// finalizer: released with this decision's end report, or on their own when there is
/// nothing else to do.
fn releasable(pods: &[Pod], members: &[Member]) -> Vec<Pod> {
    pods.iter()
        .zip(members)
        .filter(|(p, m)| matches!(m.state, MemberState::Finished { .. }) && apply::protected(p))
        .map(|(p, _)| p.clone())
        .collect()
}
