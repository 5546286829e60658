//! The story's Helm values (what a platform team writes in its `values.yaml`), one function
//! per chart. Pure: names in, JSON out.

use serde_json::{Value, json};

use super::manifests::{CLUSTER, POOL_LABEL, Pool, RESEARCH, SERVING, SYSTEM_LABEL};

/// The worker set's name (one set: the GPU pool both teams share).
pub const WORKER_SET: &str = "gpu";
/// The login set the chart makes: `<cluster>-login`; its first pod is `<set>-0`.
pub const LOGIN_SET: &str = "pool-login";

/// The charts' `image` values: `image` split at its tag.
pub fn image(image: &str) -> Value {
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image, "latest"));
    json!({"repository": repository, "tag": tag})
}

/// `tandem-operator`: watching `ns` only. At 0 replicas: where the story runs the
/// container's command line itself, or (a real cluster) checks the install alone.
pub fn operator(image_values: &Value, ns: &str) -> Value {
    json!({"image": image_values, "replicas": 0, "watchNamespace": ns})
}

/// `tandem-bridge` for the cluster `CLUSTER`, without the webhook (the harness serves no
/// admission webhooks) or leader election (one process), at 0 replicas as the operator.
pub fn bridge(image_values: &Value) -> Value {
    json!({"image": image_values, "replicas": 0, "cluster": {"name": CLUSTER},
           "webhook": {"enabled": false}, "leaderElection": {"enabled": false}})
}

/// `tandem-cluster`: the `TandemCluster` `CLUSTER` with two teams sharing one pool through
/// one fair-share tree (`researcher` a user of `research`; `serving_ns`'s pods charge
/// `serving`), the worker set `gpu` of `pool`'s shape starting at `start` workers with an
/// HPA that may take it to the whole pool, and one login pod on the system node.
pub fn cluster(pool: Pool, start: usize, serving_ns: &str, researcher: &str) -> Value {
    let (pk, pv) = POOL_LABEL;
    let (sk, sv) = SYSTEM_LABEL;
    json!({
        "nameOverride": CLUSTER,
        "controller": {"nodeSelector": {sk: sv}},
        "partitions": [{"name": "gpu", "default": true}],
        "accounts": [
            {"name": RESEARCH, "shares": 60, "users": [{"name": researcher, "default": true}]},
            {"name": SERVING, "shares": 40},
        ],
        "bridge": {"namespaces": [{"namespace": serving_ns, "account": SERVING}]},
        "workerSets": [{
            "name": WORKER_SET,
            "replicas": start,
            "partitions": ["gpu"],
            "cpus": pool.cpus,
            "memory": format!("{}G", pool.mem_gib),
            "gpus": {"count": pool.gpus},
            // Pool nodes carry the bridge's taints (`NoSchedule`, and `NoExecute` in batch
            // mode); the operator gives every worker pod the pool toleration of every
            // effect itself, so the platform team writes none (one of its own could only
            // be narrower, and a `NoSchedule`-only one got workers evicted in batch mode).
            "template": {"nodeSelector": {pk: pv}},
            "autoscaling": {"hpa": {"enabled": true, "minReplicas": start, "maxReplicas": pool.nodes}},
        }],
        "login": {"enabled": true, "replicas": 1, "template": {"nodeSelector": {sk: sv}}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_values_name_both_teams_the_pool_and_its_autoscaler() {
        let pool = Pool {
            nodes: 4,
            cpus: 8,
            mem_gib: 16,
            gpus: 2,
        };
        let v = cluster(pool, 2, "serving-1", "root");
        assert_eq!(v["nameOverride"], CLUSTER);
        assert_eq!(v["bridge"]["namespaces"][0]["namespace"], "serving-1");
        assert_eq!(v["bridge"]["namespaces"][0]["account"], SERVING);
        assert_eq!(v["accounts"][0]["users"][0]["name"], "root");
        let ws = &v["workerSets"][0];
        assert_eq!(ws["replicas"], 2);
        assert_eq!(ws["gpus"]["count"], 2);
        assert_eq!(ws["memory"], "16G");
        assert_eq!(ws["autoscaling"]["hpa"]["maxReplicas"], 4);
        // No toleration of the pool taint of the team's own: the operator's covers every
        // effect, and a narrower one (`NoSchedule` only) is what got workers evicted.
        assert!(ws["template"].get("tolerations").is_none(), "{ws}");
        assert_eq!(LOGIN_SET, format!("{CLUSTER}-login"));
        assert_eq!(
            image("reg/tandem:1.2"),
            json!({"repository": "reg/tandem", "tag": "1.2"})
        );
    }
}
