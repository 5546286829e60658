//! The scheduler loop's book of placeholders: which group each placeholder job is (its
//! key, namespace and group UID), the newest event of each, and what was submitted but not
//! seen on the stream yet. Pure: the loop feeds it the controller's placeholder events
//! and asks what a group's job looks like; every rule is a unit test.

use std::collections::{HashMap, HashSet};

use tandem_proto::v1;

use super::Target;
use crate::decide::{EndReason, JobView};
use crate::group::GroupKey;

/// A placeholder's key, as the controller keeps it: a group belongs to its namespace, so
/// the same UID in two namespaces (an LWS group key anyone can compute, a copied label) is
/// two groups, and neither's pods are ever bound onto or end the other's job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct PlaceholderId {
    pub namespace: String,
    pub uid: String,
}

impl PlaceholderId {
    pub(super) fn new(namespace: &str, uid: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
        }
    }

    fn of(ev: &v1::PlaceholderEvent) -> Self {
        Self::new(&ev.namespace, &ev.group_uid)
    }
}

/// The placeholders the loop knows and the groups they belong to.
#[derive(Default)]
pub(super) struct Book {
    /// Group -> its UID (with its namespace, the placeholder's key), once known.
    uids: HashMap<GroupKey, String>,
    keys: HashMap<PlaceholderId, GroupKey>,
    /// The newest placeholder of each group.
    jobs: HashMap<PlaceholderId, v1::PlaceholderEvent>,
    /// Submitted, not yet seen on the stream: wait for it rather than submit again.
    submitted: HashSet<PlaceholderId>,
}

impl Book {
    /// `k`'s placeholder is under `uid` (in `k`'s namespace).
    pub fn link(&mut self, k: &GroupKey, uid: String) {
        self.keys
            .insert(PlaceholderId::new(&k.namespace, &uid), k.clone());
        self.uids.insert(k.clone(), uid);
    }

    pub fn uid(&self, k: &GroupKey) -> Option<&String> {
        self.uids.get(k)
    }

    pub fn id(&self, k: &GroupKey) -> Option<PlaceholderId> {
        self.uids
            .get(k)
            .map(|u| PlaceholderId::new(&k.namespace, u))
    }

    pub fn group(&self, id: &PlaceholderId) -> Option<&GroupKey> {
        self.keys.get(id)
    }

    /// Forgets a group's link (its placeholder, if any, becomes an orphan).
    pub fn unlink(&mut self, k: &GroupKey) {
        if let Some(uid) = self.uids.remove(k) {
            self.keys.remove(&PlaceholderId::new(&k.namespace, &uid));
        }
    }

    /// Folds a placeholder event in; the target it concerns (`None` for a removal).
    pub fn apply(&mut self, ev: v1::PlaceholderEvent) -> Option<Target> {
        if ev.removed {
            self.jobs.retain(|_, j| j.job_id != ev.job_id);
            return None;
        }
        let id = PlaceholderId::of(&ev);
        self.submitted.remove(&id);
        if self.jobs.get(&id).is_none_or(|j| j.job_id <= ev.job_id) {
            self.jobs.insert(id.clone(), ev);
        }
        Some(match self.keys.get(&id) {
            Some(k) => Target::Group(k.clone()),
            None => Target::Orphan(id),
        })
    }

    /// Placeholders whose group the loop does not know.
    pub fn orphans(&self) -> Vec<PlaceholderId> {
        self.jobs
            .keys()
            .filter(|id| !self.keys.contains_key(*id))
            .cloned()
            .collect()
    }

    pub fn has_job(&self, id: &PlaceholderId) -> bool {
        self.jobs.contains_key(id)
    }

    /// `id` was submitted as `job_id`: wait for it on the stream, unless the stream
    /// brought it first.
    pub fn submitted(&mut self, id: PlaceholderId, job_id: u64) {
        if self.jobs.get(&id).is_none_or(|j| j.job_id < job_id) {
            self.submitted.insert(id);
        }
    }

    /// What the group's job looks like to a decision.
    pub fn view(&self, id: Option<&PlaceholderId>) -> JobView {
        match id {
            None => JobView::Unknown,
            Some(id) => match self.jobs.get(id) {
                Some(ev) => job_view(ev),
                None if self.submitted.contains(id) => JobView::Unknown,
                None => JobView::Absent,
            },
        }
    }

    /// The controller took this bridge's end report for `job_id`: until its stream says
    /// so too, the job counts as ended here, so a new pod of the group is not bound to
    /// the nodes the end just freed (a batch job may have them already); it gets a new
    /// placeholder instead.
    pub fn ended_here(&mut self, id: &PlaceholderId, job_id: u64) {
        if let Some(ev) = self.jobs.get_mut(id)
            && ev.job_id == job_id
        {
            mark_ended(ev);
        }
    }

    /// The controller took this bridge's release of `nodes` from `job_id`: until its
    /// stream says so too, the job is shown without them (and, when they were all it had,
    /// as ended), so they are neither released again nor bound to.
    pub fn released_here(&mut self, id: &PlaceholderId, job_id: u64, nodes: &[String]) {
        if let Some(ev) = self.jobs.get_mut(id)
            && ev.job_id == job_id
        {
            mark_released(ev, nodes);
            if ev.nodes.is_empty() {
                mark_ended(ev);
            }
        }
    }
}

/// A running placeholder as the controller shows it once a release of `released` was
/// taken: those nodes gone from it, no longer asked back.
fn mark_released(ev: &mut v1::PlaceholderEvent, released: &[String]) {
    ev.nodes.retain(|n| !released.contains(n));
    ev.releasing.retain(|n| !released.contains(n));
}

/// A running placeholder as the controller shows it once an end report was taken:
/// COMPLETED, holding nothing (or CANCELLED and the like when it was ending; the
/// controller's own event, which follows, says which).
fn mark_ended(ev: &mut v1::PlaceholderEvent) {
    use v1::JobState as S;
    if S::try_from(ev.state) == Ok(S::Running) {
        ev.state = if ev.ending != 0 {
            ev.ending
        } else {
            S::Completed as i32
        };
        ev.ending = 0;
        ev.nodes.clear();
    }
}

fn job_view(ev: &v1::PlaceholderEvent) -> JobView {
    use v1::JobState as S;
    let state = S::try_from(ev.state).unwrap_or(S::Unspecified);
    let why = |s: S| match s {
        S::Cancelled => EndReason::Cancelled,
        S::Preempted => EndReason::Preempted,
        S::Timeout => EndReason::TimedOut,
        S::NodeFail => EndReason::NodeFailed,
        _ => EndReason::PodsGone,
    };
    match state {
        S::Pending => JobView::Pending {
            job_id: ev.job_id,
            reason: ev.reason.clone(),
        },
        S::Running if ev.ending != 0 => JobView::Ending {
            job_id: ev.job_id,
            why: why(S::try_from(ev.ending).unwrap_or(S::Cancelled)),
        },
        S::Running => JobView::Allocated {
            job_id: ev.job_id,
            nodes: ev.nodes.clone(),
            pods_per_node: ev.pods_per_node,
            releasing: ev.releasing.clone(),
        },
        S::Unspecified | S::Suspended | S::Completing => JobView::Unknown,
        s => JobView::Ended {
            job_id: ev.job_id,
            why: why(s),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{Decision, Member, MemberState, decide};
    use crate::group::GroupKind;

    fn web() -> GroupKey {
        GroupKey {
            namespace: "serving".into(),
            kind: GroupKind::Pod,
            name: "web-1".into(),
        }
    }

    fn ev(job_id: u64, ns: &str, state: v1::JobState) -> v1::PlaceholderEvent {
        v1::PlaceholderEvent {
            job_id,
            group_uid: "g".into(),
            namespace: ns.into(),
            state: state as i32,
            nodes: vec!["k1".into()],
            pods_per_node: 1,
            ..Default::default()
        }
    }

    #[test]
    fn events_reach_their_group_in_their_namespace_only() {
        let mut b = Book::default();
        b.link(&web(), "g".into());
        let id = b.id(&web());
        assert_eq!(
            b.apply(ev(7, "serving", v1::JobState::Running)),
            Some(Target::Group(web()))
        );
        assert!(matches!(
            b.view(id.as_ref()),
            JobView::Allocated { job_id: 7, .. }
        ));
        // The same UID in another namespace is another group's: an orphan here.
        let other = b.apply(ev(8, "mallory", v1::JobState::Running));
        assert_eq!(
            other,
            Some(Target::Orphan(PlaceholderId::new("mallory", "g")))
        );
        assert_eq!(b.orphans(), vec![PlaceholderId::new("mallory", "g")]);
        assert!(matches!(
            b.view(id.as_ref()),
            JobView::Allocated { job_id: 7, .. }
        ));
        // An older job's late event never replaces the newer one.
        b.apply(ev(9, "serving", v1::JobState::Pending));
        b.apply(ev(7, "serving", v1::JobState::Completed));
        assert!(matches!(
            b.view(id.as_ref()),
            JobView::Pending { job_id: 9, .. }
        ));
        // Removed records are forgotten; unlinking makes a placeholder an orphan.
        b.apply(v1::PlaceholderEvent {
            job_id: 8,
            removed: true,
            ..Default::default()
        });
        assert!(b.orphans().is_empty());
        b.unlink(&web());
        assert_eq!(b.orphans(), vec![PlaceholderId::new("serving", "g")]);
    }

    #[test]
    fn a_release_taken_here_shows_the_job_without_the_nodes_before_the_stream_does() {
        let mut b = Book::default();
        b.link(&web(), "g".into());
        let id = b.id(&web()).unwrap();
        let mut two = ev(7, "serving", v1::JobState::Running);
        two.nodes = vec!["k1".into(), "k2".into()];
        two.releasing = vec!["k1".into()];
        b.apply(two);
        assert_eq!(
            b.view(Some(&id)),
            JobView::Allocated {
                job_id: 7,
                nodes: vec!["k1".into(), "k2".into()],
                pods_per_node: 1,
                releasing: vec!["k1".into()],
            }
        );
        // Another job's release changes nothing.
        b.released_here(&id, 6, &["k1".into()]);
        assert!(
            matches!(b.view(Some(&id)), JobView::Allocated { ref releasing, .. } if releasing.len() == 1)
        );
        b.released_here(&id, 7, &["k1".into()]);
        assert_eq!(
            b.view(Some(&id)),
            JobView::Allocated {
                job_id: 7,
                nodes: vec!["k2".into()],
                pods_per_node: 1,
                releasing: vec![],
            }
        );
        // Its last node released: ended here, as an end report.
        b.released_here(&id, 7, &["k2".into()]);
        assert!(matches!(
            b.view(Some(&id)),
            JobView::Ended { job_id: 7, .. }
        ));
    }

    #[test]
    fn a_submitted_placeholder_is_waited_for_not_submitted_again() {
        let mut b = Book::default();
        b.link(&web(), "g".into());
        let id = b.id(&web()).unwrap();
        assert_eq!(b.view(Some(&id)), JobView::Absent);
        b.submitted(id.clone(), 3);
        assert_eq!(b.view(Some(&id)), JobView::Unknown);
        b.apply(ev(3, "serving", v1::JobState::Pending));
        assert!(matches!(
            b.view(Some(&id)),
            JobView::Pending { job_id: 3, .. }
        ));
        assert_eq!(b.view(None), JobView::Unknown);
    }

    #[test]
    fn a_job_ended_here_frees_nothing_for_new_pods_before_the_stream_says_so() {
        let mut b = Book::default();
        b.link(&web(), "g".into());
        let id = b.id(&web()).unwrap();
        b.apply(ev(7, "serving", v1::JobState::Running));
        assert!(matches!(b.view(Some(&id)), JobView::Allocated { .. }));
        b.ended_here(&id, 7);
        // A new pod of the group now gets a new placeholder, never the freed node.
        let fresh = [Member {
            name: "new".into(),
            rank: None,
            node: None,
            state: MemberState::Live,
        }];
        assert_eq!(
            decide(&fresh, Some(1), &b.view(Some(&id)), 0),
            Decision::Submit
        );
        // An ending job ends as what it was ending for.
        let mut cancelled = ev(7, "serving", v1::JobState::Running);
        cancelled.ending = v1::JobState::Cancelled as i32;
        mark_ended(&mut cancelled);
        assert_eq!(
            job_view(&cancelled),
            JobView::Ended {
                job_id: 7,
                why: EndReason::Cancelled
            }
        );
    }
}
