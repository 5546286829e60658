//! Minimal built-in workload controllers, so Deployments, ReplicaSets, StatefulSets and Jobs
//! make pods as on a real cluster (pods then wait for a scheduler or a bridge to bind them,
//! and for a kubelet to run them).
//!
//! Like real controllers they are API clients of this server: pods are created and deleted
//! through the normal write path, so admission webhooks see them. Each pass plans from one
//! snapshot of the store (pure: [`plan`]) and then carries the actions out; passes run after
//! every change, and a pass whose actions fail waits for the next change (no busy loop).
//!
//! # Simplifications
//! - Deployments: one ReplicaSet per pod template (`<name>-<hash>`, label
//!   `pod-template-hash`); a template change scales the old ReplicaSets to 0 at once
//!   (Recreate-like), whatever the strategy says.
//! - ReplicaSets: orphans are not adopted; surplus pods go unbound first, then not-ready,
//!   then newest.
//! - StatefulSets: pods `<name>-<ordinal>` with `hostname`/`subdomain`, claims from
//!   `volumeClaimTemplates` (`<template>-<name>-<ordinal>`, kept on scale-down);
//!   `OrderedReady` creates the next ordinal only when all lower ones are Running and Ready
//!   and removes the highest first; failed pods are deleted and recreated; template changes
//!   do not roll existing pods.
//! - Jobs: `parallelism`, `completions`, `backoffLimit`, `suspend`, `completionMode: Indexed`
//!   (the `batch.kubernetes.io/job-completion-index` annotation and label);
//!   no pod failure policy, no `activeDeadlineSeconds`, no `ttlSecondsAfterFinished`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::Ctx;
use super::meta;
use super::ops::{self, Change, DeleteOpts, Target, WriteOpts};
use super::patch::PatchKind;
use super::store::State;
use super::strategy::Part;

/// One step a controller takes through the API.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Create {
        key: &'static str,
        ns: String,
        obj: Value,
    },
    Delete {
        key: &'static str,
        ns: String,
        name: String,
    },
    /// Merge patch of the main resource (e.g. a ReplicaSet's `spec.replicas`).
    Patch {
        key: &'static str,
        ns: String,
        name: String,
        patch: Value,
    },
    /// Merge patch of the status subresource.
    Status {
        key: &'static str,
        ns: String,
        name: String,
        status: Value,
    },
}

const PODS: &str = "pods";
const PVCS: &str = "persistentvolumeclaims";
const RS: &str = "replicasets.apps";
const DEPLOY: &str = "deployments.apps";
const STS: &str = "statefulsets.apps";
const JOBS: &str = "jobs.batch";

pub async fn run(ctx: Arc<Ctx>) {
    let mut changed = ctx.store.subscribe();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let actions = ctx.store.with(|st| plan(st));
        for a in actions {
            if let Err(e) = execute(&ctx, &a).await {
                tracing::debug!(action = ?a, error = %e, "workload controller action failed");
            }
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

async fn execute(ctx: &Ctx, a: &Action) -> Result<(), super::ApiError> {
    let target = |key: &str, ns: &str, name: &str, st: &State| {
        st.types.get(key).map(|t| Target {
            rt: t.rt.clone(),
            version: t.rt.storage_version().to_owned(),
            ns: ns.to_owned(),
            name: name.to_owned(),
            sub: String::new(),
        })
    };
    let opts = WriteOpts {
        field_manager: Some("kube-sim-controllers".into()),
        ..WriteOpts::default()
    };
    match a {
        Action::Create { key, ns, obj } => {
            let Some(t) = target(key, ns, "", &ctx.store.lock()) else {
                return Ok(());
            };
            ops::create(ctx, &t, obj.clone(), &opts).await.map(|_| ())
        }
        Action::Delete { key, ns, name } => {
            let Some(t) = target(key, ns, name, &ctx.store.lock()) else {
                return Ok(());
            };
            ops::delete(ctx, &t, &DeleteOpts::default())
                .await
                .map(|_| ())
        }
        Action::Patch {
            key,
            ns,
            name,
            patch,
        } => {
            let Some(t) = target(key, ns, name, &ctx.store.lock()) else {
                return Ok(());
            };
            ops::update(
                ctx,
                &t,
                Change::Patch(PatchKind::Merge, patch),
                Part::Main,
                &opts,
            )
            .await
            .map(|_| ())
        }
        Action::Status {
            key,
            ns,
            name,
            status,
        } => {
            let Some(t) = target(key, ns, name, &ctx.store.lock()) else {
                return Ok(());
            };
            let patch = json!({"status": status});
            ops::update(
                ctx,
                &t,
                Change::Patch(PatchKind::Merge, &patch),
                Part::Status,
                &opts,
            )
            .await
            .map(|_| ())
        }
    }
}

// === planning (pure over a snapshot) ===

fn objects<'a>(st: &'a State, key: &str) -> impl Iterator<Item = &'a Value> + 'a {
    st.types
        .get(key)
        .into_iter()
        .flat_map(|t| t.objects.values())
}

/// Pods whose controller owner reference names `uid`.
fn owned_pods<'a>(st: &'a State, ns: &'a str, uid: &'a str) -> Vec<&'a Value> {
    objects(st, PODS)
        .filter(|p| meta::namespace(p) == ns)
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| {
                    refs.iter()
                        .any(|r| r["uid"] == uid && r["controller"] == true)
                })
        })
        .collect()
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("Pending")
}

fn terminal(p: &Value) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

fn ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
    })
}

/// A pod (or other object) from a template, owned by `owner`.
fn from_template(template: &Value, owner: &Value, extra_labels: &Map<String, Value>) -> Value {
    let mut metadata = template["metadata"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.extend(extra_labels.clone());
    }
    metadata.insert("ownerReferences".into(), json!([controller_ref(owner)]));
    metadata.remove("name");
    metadata.remove("namespace");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

/// FNV-1a of the template's JSON: a stable `pod-template-hash`.
fn template_hash(template: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in template.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|i| ALPHABET[((h >> (i * 6)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1).max(0)
}

/// Adds a status action if the computed fields differ from the stored status.
fn status_if_changed(out: &mut Vec<Action>, key: &'static str, obj: &Value, status: Value) {
    let current = &obj["status"];
    let differs = status
        .as_object()
        .is_some_and(|m| m.iter().any(|(k, v)| current.get(k) != Some(v)));
    if differs {
        out.push(Action::Status {
            key,
            ns: meta::namespace(obj).to_owned(),
            name: meta::name(obj).to_owned(),
            status,
        });
    }
}

/// Everything the controllers would do now.
pub fn plan(st: &State) -> Vec<Action> {
    let mut out = Vec::new();
    for d in objects(st, DEPLOY).filter(|o| !meta::is_deleting(o)) {
        plan_deployment(st, d, &mut out);
    }
    for rs in objects(st, RS).filter(|o| !meta::is_deleting(o)) {
        plan_replicaset(st, rs, &mut out);
    }
    for s in objects(st, STS).filter(|o| !meta::is_deleting(o)) {
        plan_statefulset(st, s, &mut out);
    }
    for j in objects(st, JOBS).filter(|o| !meta::is_deleting(o)) {
        plan_job(st, j, &mut out);
    }
    out
}

fn plan_deployment(st: &State, d: &Value, out: &mut Vec<Action>) {
    let (ns, name, uid) = (meta::namespace(d), meta::name(d), meta::uid(d));
    let hash = template_hash(&d["spec"]["template"]);
    let rs_name = format!("{name}-{hash}");
    let owned: Vec<&Value> = objects(st, RS)
        .filter(|r| {
            meta::namespace(r) == ns
                && r["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|x| x["uid"] == uid))
        })
        .collect();
    let want = replicas(d);
    match owned.iter().find(|r| meta::name(r) == rs_name) {
        None => {
            let mut template = d["spec"]["template"].clone();
            template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
            let mut selector = d["spec"]["selector"].clone();
            selector["matchLabels"]["pod-template-hash"] = json!(hash);
            let mut labels = template["metadata"]["labels"].clone();
            labels["pod-template-hash"] = json!(hash);
            let rs = json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": rs_name, "labels": labels, "ownerReferences": [controller_ref(d)],
                    "annotations": {"deployment.kubernetes.io/revision": (owned.len() + 1).to_string()}},
                "spec": {"replicas": want, "selector": selector, "template": template},
            });
            out.push(Action::Create {
                key: RS,
                ns: ns.to_owned(),
                obj: rs,
            });
        }
        Some(rs) if replicas(rs) != want => {
            out.push(Action::Patch {
                key: RS,
                ns: ns.to_owned(),
                name: rs_name.clone(),
                patch: json!({"spec": {"replicas": want}}),
            });
        }
        Some(_) => {}
    }
    for old in owned
        .iter()
        .filter(|r| meta::name(r) != rs_name && replicas(r) > 0)
    {
        out.push(Action::Patch {
            key: RS,
            ns: ns.to_owned(),
            name: meta::name(old).to_owned(),
            patch: json!({"spec": {"replicas": 0}}),
        });
    }
    let sum = |f: &str| {
        owned
            .iter()
            .map(|r| r["status"][f].as_i64().unwrap_or(0))
            .sum::<i64>()
    };
    let updated = owned
        .iter()
        .find(|r| meta::name(r) == rs_name)
        .map_or(0, |r| r["status"]["replicas"].as_i64().unwrap_or(0));
    let available = sum("availableReplicas");
    let status = json!({
        "observedGeneration": d["metadata"]["generation"],
        "replicas": sum("replicas"),
        "updatedReplicas": updated,
        "readyReplicas": sum("readyReplicas"),
        "availableReplicas": available,
        "unavailableReplicas": (want - available).max(0),
        "conditions": [{"type": "Available", "status": if available >= want { "True" } else { "False" },
            "reason": if available >= want { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }}],
    });
    status_if_changed(out, DEPLOY, d, status);
}

fn plan_replicaset(st: &State, rs: &Value, out: &mut Vec<Action>) {
    let (ns, uid) = (meta::namespace(rs), meta::uid(rs));
    let pods = owned_pods(st, ns, uid);
    let mut active: Vec<&Value> = pods
        .iter()
        .copied()
        .filter(|p| !meta::is_deleting(p) && !terminal(p))
        .collect();
    let want = usize::try_from(replicas(rs)).unwrap_or(0);
    if active.len() < want {
        let labels = rs["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for _ in active.len()..want {
            let mut pod = from_template(&rs["spec"]["template"], rs, &labels);
            pod["metadata"]["generateName"] = json!(format!("{}-", meta::name(rs)));
            out.push(Action::Create {
                key: PODS,
                ns: ns.to_owned(),
                obj: pod,
            });
        }
    } else if active.len() > want {
        // Unbound first, then not ready, then newest (the real controller's ranking, simplified).
        active.sort_by_key(|p| {
            let bound = p["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
            (
                bound,
                ready(p),
                std::cmp::Reverse(
                    p["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                ),
            )
        });
        for p in &active[..active.len() - want] {
            out.push(Action::Delete {
                key: PODS,
                ns: ns.to_owned(),
                name: meta::name(p).to_owned(),
            });
        }
    }
    let live: Vec<&Value> = pods
        .iter()
        .copied()
        .filter(|p| !meta::is_deleting(p) && !terminal(p))
        .collect();
    let n_ready = live.iter().filter(|p| ready(p)).count();
    let status = json!({
        "observedGeneration": rs["metadata"]["generation"],
        "replicas": live.len(),
        "fullyLabeledReplicas": live.len(),
        "readyReplicas": n_ready,
        "availableReplicas": n_ready,
    });
    status_if_changed(out, RS, rs, status);
}

fn plan_statefulset(st: &State, s: &Value, out: &mut Vec<Action>) {
    let (ns, name) = (meta::namespace(s), meta::name(s));
    let want = replicas(s);
    let parallel = s["spec"]["podManagementPolicy"].as_str() == Some("Parallel");
    let pods: BTreeMap<i64, &Value> = owned_pods(st, ns, meta::uid(s))
        .into_iter()
        .filter_map(|p| {
            let ord = meta::name(p)
                .strip_prefix(name)?
                .strip_prefix('-')?
                .parse()
                .ok()?;
            Some((ord, p))
        })
        .collect();
    let templates: Vec<&Value> = s["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for ord in 0..want {
        let pod_name = format!("{name}-{ord}");
        match pods.get(&ord) {
            Some(p) if phase(p) == "Failed" && !meta::is_deleting(p) => {
                out.push(Action::Delete {
                    key: PODS,
                    ns: ns.to_owned(),
                    name: pod_name,
                });
                if !parallel {
                    break;
                }
            }
            Some(p) => {
                let running_ready = phase(p) == "Running" && ready(p);
                if !parallel && !running_ready {
                    break;
                }
            }
            None => {
                for t in &templates {
                    let claim = format!("{}-{pod_name}", meta::name(t));
                    if st.try_get(PVCS, ns, &claim).is_none() {
                        let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": t["metadata"], "spec": t["spec"]});
                        pvc["metadata"]["name"] = json!(claim);
                        out.push(Action::Create {
                            key: PVCS,
                            ns: ns.to_owned(),
                            obj: pvc,
                        });
                    }
                }
                let mut labels = Map::new();
                labels.insert("statefulset.kubernetes.io/pod-name".into(), json!(pod_name));
                labels.insert(
                    "apps.kubernetes.io/pod-index".into(),
                    json!(ord.to_string()),
                );
                let mut pod = from_template(&s["spec"]["template"], s, &labels);
                pod["metadata"]["name"] = json!(pod_name);
                pod["spec"]["hostname"] = json!(pod_name);
                if let Some(svc) = s["spec"]["serviceName"].as_str() {
                    pod["spec"]["subdomain"] = json!(svc);
                }
                for t in &templates {
                    let claim = format!("{}-{pod_name}", meta::name(t));
                    let vols = pod["spec"]
                        .as_object_mut()
                        .map(|m| m.entry("volumes").or_insert_with(|| json!([])));
                    if let Some(Value::Array(v)) = vols {
                        v.push(json!({"name": meta::name(t), "persistentVolumeClaim": {"claimName": claim}}));
                    }
                }
                out.push(Action::Create {
                    key: PODS,
                    ns: ns.to_owned(),
                    obj: pod,
                });
                if !parallel {
                    break;
                }
            }
        }
    }
    // Scale down: highest ordinal first (all at once for Parallel).
    let surplus: Vec<(&i64, &&Value)> = pods
        .iter()
        .rev()
        .filter(|(o, p)| **o >= want && !meta::is_deleting(p))
        .collect();
    let deleting_surplus = pods.iter().any(|(o, p)| *o >= want && meta::is_deleting(p));
    for (ord, _) in surplus.iter().take(if parallel {
        usize::MAX
    } else if deleting_surplus {
        0
    } else {
        1
    }) {
        out.push(Action::Delete {
            key: PODS,
            ns: ns.to_owned(),
            name: format!("{name}-{ord}"),
        });
    }
    let live: Vec<&&Value> = pods.values().filter(|p| !meta::is_deleting(p)).collect();
    let n_ready = live.iter().filter(|p| ready(p)).count();
    let status = json!({
        "observedGeneration": s["metadata"]["generation"],
        "replicas": live.len(),
        "readyReplicas": n_ready,
        "currentReplicas": live.len(),
        "updatedReplicas": live.len(),
        "availableReplicas": n_ready,
    });
    status_if_changed(out, STS, s, status);
}

fn plan_job(st: &State, j: &Value, out: &mut Vec<Action>) {
    let (ns, name, uid) = (meta::namespace(j), meta::name(j), meta::uid(j));
    let pods = owned_pods(st, ns, uid);
    let finished = j["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    });
    let active: Vec<&Value> = pods
        .iter()
        .copied()
        .filter(|p| !terminal(p) && !meta::is_deleting(p))
        .collect();
    let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
    let failed = pods.iter().filter(|p| phase(p) == "Failed").count() as i64;
    let completions = j["spec"]["completions"].as_i64().unwrap_or(1);
    let parallelism = j["spec"]["parallelism"].as_i64().unwrap_or(1);
    let backoff = j["spec"]["backoffLimit"].as_i64().unwrap_or(6);
    let suspended = j["spec"]["suspend"].as_bool() == Some(true);
    let indexed = j["spec"]["completionMode"].as_str() == Some("Indexed");
    let now = meta::now_rfc3339();
    let mut status = json!({"active": active.len(), "succeeded": succeeded, "failed": failed,
        "ready": active.iter().filter(|p| ready(p)).count()});
    if finished {
        return;
    }
    let cond = |t: &str, reason: &str| json!({"type": t, "status": "True", "reason": reason, "lastProbeTime": now, "lastTransitionTime": now});
    if failed > backoff {
        status["conditions"] = json!([
            cond("FailureTarget", "BackoffLimitExceeded"),
            cond("Failed", "BackoffLimitExceeded")
        ]);
        for p in &active {
            out.push(Action::Delete {
                key: PODS,
                ns: ns.to_owned(),
                name: meta::name(p).to_owned(),
            });
        }
    } else if succeeded >= completions {
        status["conditions"] = json!([
            cond("SuccessCriteriaMet", "CompletionsReached"),
            cond("Complete", "CompletionsReached")
        ]);
        status["completionTime"] = json!(now);
    } else if suspended {
        for p in &active {
            out.push(Action::Delete {
                key: PODS,
                ns: ns.to_owned(),
                name: meta::name(p).to_owned(),
            });
        }
    } else {
        let want = parallelism.min(completions - succeeded) - active.len() as i64;
        let index_of = |p: &Value| {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                .as_str()
                .and_then(|i| i.parse::<i64>().ok())
        };
        let taken: Vec<i64> = pods
            .iter()
            .filter(|p| phase(p) == "Succeeded" || (!terminal(p) && !meta::is_deleting(p)))
            .filter_map(|p| index_of(p))
            .collect();
        let mut free = (0..completions).filter(|i| !taken.contains(i));
        for _ in 0..want.max(0) {
            let mut labels = Map::new();
            for (k, v) in [
                ("batch.kubernetes.io/controller-uid", uid),
                ("batch.kubernetes.io/job-name", name),
                ("controller-uid", uid),
                ("job-name", name),
            ] {
                labels.insert(k.into(), json!(v));
            }
            let index = if indexed { free.next() } else { None };
            if indexed && index.is_none() {
                break;
            }
            if let Some(i) = index {
                labels.insert(
                    "batch.kubernetes.io/job-completion-index".into(),
                    json!(i.to_string()),
                );
            }
            let mut pod = from_template(&j["spec"]["template"], j, &labels);
            match index {
                Some(i) => {
                    pod["metadata"]["generateName"] = json!(format!("{name}-{i}-"));
                    pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] =
                        json!(i.to_string());
                    pod["spec"]["hostname"] = json!(format!("{name}-{i}"));
                }
                None => pod["metadata"]["generateName"] = json!(format!("{name}-")),
            }
            out.push(Action::Create {
                key: PODS,
                ns: ns.to_owned(),
                obj: pod,
            });
        }
    }
    if j["status"]["startTime"].is_null() && !suspended {
        status["startTime"] = json!(now);
    }
    // Timestamps change every pass: write when a counter moved or a condition or the start
    // time is new.
    let current = &j["status"];
    let differs = ["active", "succeeded", "failed", "ready"]
        .iter()
        .any(|k| current.get(*k) != Some(&status[*k]))
        || !status["conditions"].is_null()
        || !status["startTime"].is_null();
    if differs {
        out.push(Action::Status {
            key: JOBS,
            ns: ns.to_owned(),
            name: name.to_owned(),
            status,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_hash_is_stable_and_sensitive() {
        let a = json!({"spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        let b = json!({"spec": {"containers": [{"name": "c", "image": "x:2"}]}});
        assert_eq!(template_hash(&a), template_hash(&a.clone()));
        assert_ne!(template_hash(&a), template_hash(&b));
        assert_eq!(template_hash(&a).len(), 10);
    }
}
