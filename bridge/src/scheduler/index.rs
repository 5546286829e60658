//! The scheduler loop's index of pods and their groups: which pods the bridge knows, the
//! group each belongs to, the members of each group, the pods that vanished while they may
//! still run (ghosts), and the pods a watch relist did not see again. Pure: the loop feeds
//! it watch events and asks it which groups to decide again; no I/O, no clock (time is an
//! argument), so every rule is a unit test.

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use crate::group::{self, GroupInfo, GroupKey, group_of};

/// A pod's key: (namespace, name).
pub(super) type PodKey = (String, String);

/// A bound pod that vanished from the API before its containers were reported stopped
/// (its slot finalizer removed by hand, or bound before the bridge set one): its slot stays
/// held until `deadline`, whatever the API says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ghost {
    pub name: String,
    pub rank: Option<u32>,
    pub node: String,
    pub deadline: i64,
}

/// What [`GroupIndex::upsert`] did to the groups.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Upserted {
    /// The pod's group now; `None` when it belongs to none (it is still indexed).
    pub group: Option<GroupInfo>,
    /// The group it left (its labels changed), to be decided again too.
    pub left: Option<GroupKey>,
}

#[derive(Default)]
pub(super) struct GroupIndex {
    pods: HashMap<PodKey, Pod>,
    pod_group: HashMap<PodKey, GroupInfo>,
    members: HashMap<GroupKey, BTreeSet<String>>,
    /// Pods seen since the pod watch (re)started listing; at the list's end, pods not in
    /// it were deleted while the watch was away (the watcher emits no Delete for them).
    relist: Option<HashSet<PodKey>>,
    ghosts: HashMap<GroupKey, Vec<Ghost>>,
    /// Workload pod groups whose policy is `basic`: their pods are grouped one by one (the
    /// pod groups of a Workload are immutable).
    basic: HashSet<GroupKey>,
}

pub(super) fn pod_key(p: &Pod) -> PodKey {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

impl GroupIndex {
    /// Adds or replaces a pod.
    pub fn upsert(&mut self, p: Pod) -> Upserted {
        let key = pod_key(&p);
        let grouped = group_of(&p).and_then(|i| {
            if self.basic.contains(&i.key) {
                group::single(&p)
            } else {
                Ok(i)
            }
        });
        if let Some(seen) = self.relist.as_mut() {
            seen.insert(key.clone());
        }
        let mut out = Upserted::default();
        let old = self.pod_group.remove(&key);
        match grouped {
            Ok(info) => {
                if let Some(o) = old.filter(|o| o.key != info.key) {
                    self.leave(&o.key, &key.1);
                    out.left = Some(o.key);
                }
                self.members
                    .entry(info.key.clone())
                    .or_default()
                    .insert(key.1.clone());
                self.pod_group.insert(key.clone(), info.clone());
                out.group = Some(info);
            }
            Err(e) => {
                tracing::debug!(pod = %key.1, error = %e, "pod not grouped");
                if let Some(o) = old {
                    self.leave(&o.key, &key.1);
                    out.left = Some(o.key);
                }
            }
        }
        self.pods.insert(key, p);
        out
    }

    fn leave(&mut self, group: &GroupKey, name: &str) {
        if let Some(m) = self.members.get_mut(group) {
            m.remove(name);
        }
    }

    /// Removes a pod; what was known of it and its group.
    pub fn remove(&mut self, key: &PodKey) -> Option<(Pod, Option<GroupInfo>)> {
        let pod = self.pods.remove(key)?;
        let info = self.pod_group.remove(key);
        if let Some(i) = &info {
            self.leave(&i.key, &key.1);
        }
        Some((pod, info))
    }

    /// The pod watch (re)starts listing.
    pub fn relist_start(&mut self) {
        self.relist = Some(HashSet::new());
    }

    /// The list is complete: the pods it did not bring again, deleted meanwhile (still
    /// indexed: the caller removes them as it does any deleted pod).
    pub fn relist_end(&mut self) -> Vec<Pod> {
        let Some(seen) = self.relist.take() else {
            return Vec::new();
        };
        self.pods
            .iter()
            .filter(|(k, _)| !seen.contains(*k))
            .map(|(_, p)| p.clone())
            .collect()
    }

    pub fn pod(&self, key: &PodKey) -> Option<&Pod> {
        self.pods.get(key)
    }

    pub fn pod_mut(&mut self, key: &PodKey) -> Option<&mut Pod> {
        self.pods.get_mut(key)
    }

    pub fn info(&self, key: &PodKey) -> Option<&GroupInfo> {
        self.pod_group.get(key)
    }

    /// Every group with members or ghosts.
    pub fn groups(&self) -> Vec<GroupKey> {
        let mut all: BTreeSet<GroupKey> = self.members.keys().cloned().collect();
        all.extend(self.ghosts.keys().cloned());
        all.into_iter().collect()
    }

    /// Groups of `namespace` with pods.
    pub fn groups_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a GroupKey> {
        self.members
            .iter()
            .filter(move |(k, m)| k.namespace == namespace && !m.is_empty())
            .map(|(k, _)| k)
    }

    /// The group's pods, as last seen.
    pub fn pods_of(&self, k: &GroupKey) -> Vec<Pod> {
        self.members
            .get(k)
            .into_iter()
            .flatten()
            .filter_map(|name| self.pods.get(&(k.namespace.clone(), name.clone())).cloned())
            .collect()
    }

    /// Groups with a pod bound to `node`.
    pub fn groups_on_node(&self, node: &str) -> Vec<GroupKey> {
        self.pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter_map(|(k, _)| self.pod_group.get(k).map(|i| i.key.clone()))
            .collect()
    }

    pub fn add_ghost(&mut self, k: GroupKey, g: Ghost) {
        self.ghosts.entry(k).or_default().push(g);
    }

    pub fn ghosts(&self, k: &GroupKey) -> &[Ghost] {
        self.ghosts.get(k).map_or(&[], Vec::as_slice)
    }

    /// Drops the group's ghosts whose deadline is past (they have been decided on).
    pub fn drop_due_ghosts(&mut self, k: &GroupKey, now: i64) {
        if let Some(gs) = self.ghosts.get_mut(k) {
            gs.retain(|g| g.deadline > now);
            if gs.is_empty() {
                self.ghosts.remove(k);
            }
        }
    }

    /// Groups with a ghost whose deadline has come: to decide again.
    pub fn groups_with_due_ghosts(&self, now: i64) -> Vec<GroupKey> {
        self.ghosts
            .iter()
            .filter(|(_, gs)| gs.iter().any(|g| g.deadline <= now))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A Workload group turned out `basic`: its pods leave it, to be indexed again one by
    /// one (returned for the caller's [`GroupIndex::upsert`]).
    pub fn make_basic(&mut self, k: &GroupKey) -> Vec<Pod> {
        self.basic.insert(k.clone());
        let pods = self.pods_of(k);
        self.members.remove(k);
        pods
    }

    /// Forgets a group with no pods left.
    pub fn forget(&mut self, k: &GroupKey) {
        self.members.remove(k);
        self.ghosts.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::GroupKind;
    use serde_json::json;

    fn pod(name: &str, labels: serde_json::Value, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "labels": labels},
            "spec": {"containers": [], "nodeName": node},
        }))
        .unwrap()
    }

    fn pg(name: &str) -> GroupKey {
        GroupKey {
            namespace: "ml".into(),
            kind: GroupKind::PodGroup,
            name: name.into(),
        }
    }

    const PG: &str = "scheduling.x-k8s.io/pod-group";

    #[test]
    fn pods_join_their_group_and_leave_it_when_their_labels_change() {
        let mut ix = GroupIndex::default();
        let up = ix.upsert(pod("a", json!({PG: "g1"}), None));
        assert_eq!(up.group.map(|g| g.key), Some(pg("g1")));
        assert_eq!(up.left, None);
        ix.upsert(pod("b", json!({PG: "g1"}), Some("k1")));
        assert_eq!(ix.pods_of(&pg("g1")).len(), 2);
        assert_eq!(ix.groups_on_node("k1"), vec![pg("g1")]);
        // Relabelled: it leaves g1 (decided again) for g2.
        let up = ix.upsert(pod("a", json!({PG: "g2"}), None));
        assert_eq!(up.left, Some(pg("g1")));
        assert_eq!(ix.pods_of(&pg("g1")).len(), 1);
        assert_eq!(ix.pods_of(&pg("g2")).len(), 1);
        assert_eq!(ix.groups_in("ml").count(), 2);
        assert_eq!(ix.groups_in("other").count(), 0);
        let (p, info) = ix.remove(&("ml".into(), "b".into())).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("b"));
        assert_eq!(info.map(|i| i.key), Some(pg("g1")));
        assert!(ix.pods_of(&pg("g1")).is_empty());
        assert_eq!(ix.groups_in("ml").count(), 1);
    }

    #[test]
    fn a_relist_finds_the_pods_deleted_while_the_watch_was_away() {
        let mut ix = GroupIndex::default();
        ix.upsert(pod("a", json!({}), Some("k1")));
        ix.upsert(pod("b", json!({}), Some("k1")));
        ix.relist_start();
        ix.upsert(pod("b", json!({}), Some("k1")));
        let missed = ix.relist_end();
        let names: Vec<_> = missed
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(names, vec!["a".to_owned()]);
        // No relist running: nothing is missed.
        assert!(ix.relist_end().is_empty());
    }

    #[test]
    fn ghosts_hold_until_their_deadline_then_are_dropped_once_decided() {
        let mut ix = GroupIndex::default();
        let g = Ghost {
            name: "a".into(),
            rank: None,
            node: "k1".into(),
            deadline: 100,
        };
        ix.add_ghost(pg("g1"), g.clone());
        assert_eq!(ix.ghosts(&pg("g1")), std::slice::from_ref(&g));
        assert_eq!(
            ix.groups(),
            vec![pg("g1")],
            "a group of ghosts alone is still a group"
        );
        assert!(ix.groups_with_due_ghosts(99).is_empty());
        assert_eq!(ix.groups_with_due_ghosts(100), vec![pg("g1")]);
        ix.drop_due_ghosts(&pg("g1"), 99);
        assert_eq!(ix.ghosts(&pg("g1")).len(), 1);
        ix.drop_due_ghosts(&pg("g1"), 100);
        assert!(ix.ghosts(&pg("g1")).is_empty());
        assert!(ix.groups().is_empty());
    }

    #[test]
    fn a_basic_workload_groups_its_pods_one_by_one() {
        let mut ix = GroupIndex::default();
        let wl = |name: &str| {
            let mut p = pod(name, json!({}), None);
            if let Some(s) = p.spec.as_mut() {
                s.workload_ref =
                    Some(serde_json::from_value(json!({"name": "w", "podGroup": "pg"})).unwrap());
            }
            p
        };
        let key = ix.upsert(wl("a")).group.unwrap().key;
        ix.upsert(wl("b"));
        assert_eq!(key.kind, GroupKind::Workload);
        let again = ix.make_basic(&key);
        assert_eq!(again.len(), 2);
        for p in again {
            let g = ix.upsert(p).group.unwrap();
            assert_eq!(g.key.kind, GroupKind::Pod);
        }
        assert!(ix.pods_of(&key).is_empty());
    }
}
