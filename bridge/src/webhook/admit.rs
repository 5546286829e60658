//! The admission decision for one Pod: pure, from the request and the namespace map.
//!
//! A pod is *managed* when its namespace is named in the `TandemCluster`'s
//! `spec.bridge.namespaces`, when it carries the label `tandem.dev/managed: "true"`, or when it
//! already names the `tandem` scheduler. A managed pod is mutated to name the `tandem`
//! scheduler and to tolerate the pool taint, and refused (every problem listed, each naming
//! its field) when:
//!
//! - a `tandem.dev/*` annotation does not parse ([`crate::annotations`]);
//! - `tandem.dev/account` names an account its namespace may not charge, or the namespace is
//!   not mapped at all ([`crate::policy`]): no pod spends another team's share;
//! - `spec.nodeName` is preset: such a pod bypasses every scheduler, and the kubelet does
//!   not enforce `NoSchedule` taints, so it could land on a node in `batch` mode;
//! - `spec.resourceClaims` is used: the bridge does not schedule dynamic resources yet;
//! - a container asks for a `hostPort`: a placeholder cannot reserve a port on a node, so
//!   the kubelet could reject the pod where it is bound ([`crate::fit::unplaceable`]);
//! - `spec.schedulerName` names another scheduler (two schedulers must not race for a pod).
//!
//! A `spec.workloadRef` (the in-tree Workload API) is allowed: the bridge places its pod group
//! as a gang, or pod by pod for a `basic` group.
//!
//! A pod in a mapped namespace opts out with `tandem.dev/managed: "false"` (a small CPU
//! sidecar Deployment that should not wait for the pool). Everything else is allowed
//! unchanged. Until the namespace map has been read, nothing can be judged and every pod is
//! refused (fail closed; the server reports not ready meanwhile).
//!
//! On `UPDATE` only the annotations can change what was checked (the fields above are
//! immutable once created); they are checked again when they changed, so an annotation
//! edit cannot switch a running pod's account to another team's.
//!
//! # The pool-node guard
//!
//! Batch-mode pool nodes keep every other pod off ([`crate::nodes`] taints them
//! `NoSchedule` always and `NoExecute` in batch mode). Admission closes the ways around a
//! taint, for pods of *every* namespace ([`Mode::Guard`], the cluster-wide webhook entry;
//! `/mutate` and `/validate` apply the same rules to the pods they see unmanaged):
//!
//! - a pod `CREATE` whose `spec.nodeName` is a pool node ([`crate::nodes::is_pool_node`])
//!   is refused: the kubelet does not enforce `NoSchedule`, so such a pod would skip every
//!   scheduler (a managed pod with any preset node is refused above);
//! - a pod not scheduled by Tandem that tolerates the pool taint key (or every taint) is
//!   refused, on `CREATE` and on an `UPDATE` that adds the toleration: the default
//!   scheduler would otherwise place it on a pool node, and a `NoExecute` toleration would
//!   outlast the batch taint. A pod pinned (by `nodeName` or `metadata.name` node affinity,
//!   as DaemonSet pods are) to nodes none of which is in the pool is let through;
//! - a `pods/binding` onto a pool node by anyone but the binders named in the
//!   configuration (the bridge's service account, and kube-scheduler, whose binds are of
//!   pods that tolerate the `NoSchedule` taint and so passed the rule above) is refused.
//!
//! The bridge's GPU holder pods ([`crate::holder`]: `nodeName` a pool node, tolerating the
//! pool taint) pass when created by a holder identity of the configuration (the bridge's
//! service account) and carrying the holder's labels.
//!
//! Tandem's own operator pods (workers, which tolerate the pool taint, and the controller
//! and login pods) pass when *created by* an operator identity of the configuration and
//! carrying what the operator sets: the recommended labels (`managed-by: tandem-operator`,
//! the component, `tandem.dev/cluster`) and a controlling owner of the matching
//! `tandem.dev` kind. Labels and owner references alone prove nothing (whoever may create a
//! pod may write them); the requester's identity is the API server's authentication, which
//! the pod's author cannot choose. What remains: whoever can act as the operator's service
//! account (its token, impersonation, or creating pods under it in the operator's
//! namespace) can place pods on pool nodes, as can the namespaces the chart exempts.
//!
//! Until the Node list has been read, a request that names a node or tolerates the pool is
//! refused (fail closed), and nothing else is affected.
//!
//! ```text
//!   admit      the entry: which rules a pod gets (managed, or guarded)      pure
//!   managed    a managed pod's rules and its JSON patch                      pure
//!   guard      the pool-node guard's rules, pods and pods/binding            pure
//!   identity   which requesters' own pods the guard trusts                   pure
//!   tests      every rule, through admit and guard_binding
//! ```

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::labels::{MANAGED_LABEL, SCHEDULER_NAME};
use crate::policy::NamespacePolicy;

mod guard;
mod identity;
mod managed;
#[cfg(test)]
mod tests;

pub use guard::guard_binding;
pub use managed::pool_toleration;

/// The scheduler name the API server defaults an unset `spec.schedulerName` to; it means
/// "nobody chose", so a managed pod's is replaced.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What the webhook knows of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The `TandemCluster`'s name: the pool taint's value.
    pub cluster: &'a str,
    /// The namespace map; `Err` until it has been read (with why), so nothing is judged.
    pub policies: Result<&'a [NamespacePolicy], &'a str>,
    /// What the pool-node guard knows.
    pub guard: Guard<'a>,
}

/// What the pool-node guard knows and trusts.
#[derive(Debug, Clone, Copy)]
pub struct Guard<'a> {
    /// The pool nodes' names; `Err` until the Node list has been read (with why).
    pub pool_nodes: Result<&'a BTreeSet<String>, &'a str>,
    /// Usernames (as the API server authenticates them, e.g.
    /// `system:serviceaccount:tandem-system:tandem-operator`) whose worker, controller and
    /// login pods may reach pool nodes.
    pub operators: &'a [String],
    /// Usernames that may bind pods onto pool nodes (`pods/binding`).
    pub binders: &'a [String],
    /// Usernames whose GPU holder pods ([`crate::holder`]) may reach pool nodes: the
    /// bridge's own service account.
    pub holders: &'a [String],
}

/// Who sent the request, as the API server authenticated them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requester<'a> {
    pub username: &'a str,
}

/// The request's operation, as far as the decision cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    /// `old` is the pod before the update.
    Update,
    /// Delete and connect: never refused.
    Other,
}

/// Which answer the endpoint gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `/mutate`: set the scheduler and toleration, and refuse what is invalid.
    Mutate,
    /// `/validate`: only refuse; runs on the object as every mutating webhook left it.
    Validate,
    /// `/guard`: only the pool-node guard, for pods of every namespace; needs no namespace
    /// map, so it judges from the moment the Node list is read.
    Guard,
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Allow,
    /// Allowed with these JSON patch (RFC 6902) operations.
    Patch(Vec<Value>),
    /// Refused; the message lists every problem, each naming its field.
    Deny(String),
}

/// Decides on one pod in `namespace`. `old` is the pod before an update; `who` sent it.
pub fn admit(
    mode: Mode,
    op: Op,
    namespace: &str,
    pod: &Pod,
    old: Option<&Pod>,
    who: Requester<'_>,
    view: View<'_>,
) -> Verdict {
    if op == Op::Other {
        return Verdict::Allow;
    }
    if mode == Mode::Guard {
        return deny_or(
            guard::problems(op, pod, old, who, view.guard),
            Verdict::Allow,
        );
    }
    let policies = match view.policies {
        Ok(p) => p,
        Err(why) => {
            return Verdict::Deny(format!(
                "tandem-bridge cannot judge pods yet: {why}; try again shortly"
            ));
        }
    };
    let labels = pod.metadata.labels.as_ref();
    let opt = labels
        .and_then(|l| l.get(MANAGED_LABEL))
        .map(String::as_str);
    let mut problems = Vec::new();
    let opted_in = match opt {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            problems.push(format!(
                "metadata.labels[{MANAGED_LABEL}]: {other:?} is neither \"true\" nor \"false\""
            ));
            Some(true)
        }
    };
    let scheduler = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    let mapped = policies.iter().any(|p| p.namespace == namespace);
    let managed = match opted_in {
        Some(v) => v,
        None => mapped || scheduler == Some(SCHEDULER_NAME),
    };
    if !managed {
        // An opted-out pod of a mapped namespace, or any pod this endpoint sees: it is not
        // Tandem's, so it must stay off the pool.
        problems.extend(guard::problems(op, pod, old, who, view.guard));
        return deny_or(problems, Verdict::Allow);
    }

    if op == Op::Update {
        managed::check_update(namespace, pod, old, policies, &mut problems);
        return deny_or(problems, Verdict::Allow);
    }
    managed::check_create(mode, namespace, pod, policies, &mut problems);
    if mode == Mode::Validate {
        return deny_or(problems, Verdict::Allow);
    }
    let ops = managed::mutations(pod, view.cluster);
    let ok = if ops.is_empty() {
        Verdict::Allow
    } else {
        Verdict::Patch(ops)
    };
    deny_or(problems, ok)
}

fn deny_or(problems: Vec<String>, ok: Verdict) -> Verdict {
    if problems.is_empty() {
        ok
    } else {
        Verdict::Deny(problems.join("; "))
    }
}
