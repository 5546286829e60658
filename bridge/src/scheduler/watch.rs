//! The scheduler loop's reactions to what it watches: pods, Nodes, the `TandemCluster`'s
//! namespace map, the controller's placeholder events and the one-second tick. Each folds
//! the change into the loop's state and marks the targets it touches dirty; none decides
//! or calls anything (the loop's `process` and [`super::work`] do), so a burst of events is
//! only bookkeeping until the loop processes the dirty targets.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use tandem_net::auth::unix_now;
use tandem_proto::v1;
use tracing::warn;

use super::{Ghost, Loop, Target, pod_key};
use crate::batch::BatchAlloc;
use crate::cluster;
use crate::decide::{self, MemberState};
use crate::group::{GroupInfo, GroupKind};
use crate::nodes;

impl<B: BatchAlloc> Loop<B> {
    pub(super) fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => self.ix.relist_start(),
            Event::InitDone => {
                for p in self.ix.relist_end() {
                    self.on_delete(&p);
                }
                self.pods_synced = true;
                self.dirty_all();
            }
            Event::InitApply(p) | Event::Apply(p) => self.upsert(p),
            Event::Delete(p) => self.on_delete(&p),
        }
    }

    /// A pod left the API; `last` is its last state. A bound pod whose containers were not
    /// reported stopped becomes a [`Ghost`] that keeps its slot until its deadline.
    fn on_delete(&mut self, last: &Pod) {
        let key = pod_key(last);
        let now = unix_now();
        let held = match self.ix.pod(&key) {
            Some(p) => {
                !matches!(self.member(p, now).state, MemberState::Finished { .. })
                    && !matches!(self.member(last, now).state, MemberState::Finished { .. })
            }
            None => false,
        };
        let removed = self.ix.remove(&key);
        self.told.remove(&key);
        self.refusals.forget(&key);
        if let Some((_, Some(info))) = removed {
            let node = last.spec.as_ref().and_then(|s| s.node_name.clone());
            if held
                && let Some(node) = node
                && let Some(deadline) = decide::vanish_deadline(last, self.cfg.vanish_margin_s, now)
            {
                warn!(
                    pod = %key.1, namespace = %key.0, node = %node, deadline,
                    "pod vanished before its containers were reported stopped; its slot stays held until its grace period has passed"
                );
                self.ix.add_ghost(
                    info.key.clone(),
                    Ghost {
                        name: key.1.clone(),
                        rank: info.rank,
                        node,
                        deadline,
                    },
                );
            }
            self.dirty.insert(Target::Group(info.key));
        }
    }

    pub(super) fn upsert(&mut self, p: Pod) {
        let uid = |info: &GroupInfo| direct_uid(info, &p);
        let up = self.ix.upsert(p.clone());
        if let Some(info) = &up.group {
            if let Some(uid) = uid(info) {
                self.book.link(&info.key, uid);
            }
            self.dirty.insert(Target::Group(info.key.clone()));
        }
        if let Some(left) = up.left {
            self.dirty.insert(Target::Group(left));
        }
    }

    /// Every group is decided again (a watch synced, the namespace map changed).
    fn dirty_all(&mut self) {
        let all: Vec<Target> = self.ix.groups().into_iter().map(Target::Group).collect();
        self.dirty.extend(all);
    }

    pub(super) fn on_node(&mut self, ev: Event<Node>) {
        let now = unix_now();
        match ev {
            Event::Apply(n) | Event::InitApply(n) => {
                if let Some(name) = n.metadata.name.clone() {
                    // A new node, or one out of step with the modes last read: read them
                    // again. Status heartbeats change neither, and read nothing.
                    let stale =
                        nodes::plan(&n, self.controller_view(&name), &self.cfg.cluster_name)
                            .is_some();
                    if stale || !self.node_objs.contains_key(&name) {
                        self.modes_dirty = true;
                    }
                    self.node_objs.insert(name.clone(), n);
                    self.gone.remove(&name);
                    self.nodes.insert(name);
                }
            }
            Event::Delete(n) => {
                if let Some(name) = n.metadata.name {
                    self.node_objs.remove(&name);
                    self.nodes.remove(&name);
                    self.gone.insert(name.clone(), now);
                    self.dirty_on_node(&name);
                }
            }
            Event::Init | Event::InitDone => {}
        }
    }

    fn dirty_on_node(&mut self, node: &str) {
        let hit = self.ix.groups_on_node(node).into_iter().map(Target::Group);
        self.dirty.extend(hit);
    }

    pub(super) fn on_cluster(&mut self, tc: &DynamicObject) {
        self.holders.set_owner(Some(tc));
        match cluster::policies(&tc.data) {
            Ok(p) => {
                self.policies = p;
                self.dirty_all();
            }
            Err(e) => {
                warn!(error = %e, "TandemCluster namespace map refused; keeping the last one")
            }
        }
    }

    pub(super) fn on_placeholder(&mut self, ev: v1::PlaceholderEvent) {
        // An allocation or an end may flip nodes.
        self.modes_dirty = true;
        if ev.snapshot_done {
            self.jobs_synced = true;
            let orphans = self.book.orphans().into_iter().map(Target::Orphan);
            self.dirty.extend(orphans);
            self.dirty_all();
            return;
        }
        if let Some(t) = self.book.apply(ev) {
            self.dirty.insert(t);
        }
    }

    pub(super) fn on_tick(&mut self) {
        let retry = std::mem::take(&mut self.retry);
        self.dirty.extend(retry);
        let gone: Vec<String> = self.gone.keys().cloned().collect();
        for n in gone {
            self.dirty_on_node(&n);
        }
        let due = self.ix.groups_with_due_ghosts(unix_now());
        self.dirty.extend(due.into_iter().map(Target::Group));
    }
}

/// A group's UID when the pod itself says it: the pod's own, or the LWS group key (with
/// the namespace, the placeholder's key). A Job's or JobSet's UID is read from the object
/// of that name in the pod's namespace, never from the pod's labels, which anyone who may
/// create a pod can copy; PodGroups and Workloads need their object too.
fn direct_uid(info: &GroupInfo, p: &Pod) -> Option<String> {
    match info.key.kind {
        GroupKind::Pod => p.metadata.uid.clone(),
        GroupKind::LeaderWorkerSet => Some(format!("lws-{}", info.key.name)),
        GroupKind::IndexedJob | GroupKind::JobSet | GroupKind::PodGroup | GroupKind::Workload => {
            None
        }
    }
}
