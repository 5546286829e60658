//! What the platform team and the serving team apply: the `tandem-cluster` objects (a
//! `TandemCluster` with two teams sharing one pool, a worker set, a login set) and an
//! inference Deployment through the bridge. Pure: names in, YAML out.

/// The `TandemCluster`'s name (the pool taint's value, the bridge's `--cluster`).
pub const CLUSTER: &str = "pool";
/// Node label the worker set selects: the GPU pool.
pub const POOL_LABEL: (&str, &str) = ("tandem.dev/story-pool", "gpu");
/// Node label the controller and login pods select: the system node.
pub const SYSTEM_LABEL: (&str, &str) = ("tandem.dev/story-role", "system");
/// The account researchers charge (the login pod's user is in it).
pub const RESEARCH: &str = "research";
/// The account the serving namespace charges.
pub const SERVING: &str = "serving";

/// The shape of the pool.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    pub nodes: usize,
    pub cpus: u32,
    pub mem_gib: u32,
    pub gpus: u32,
}

/// The `tandem-cluster` objects: two teams share the pool through one fair-share tree,
/// `serving_ns`'s pods charge `serving`, and `researcher` is a user of `research`.
pub fn tandem_cluster(pool: Pool, serving_ns: &str, researcher: &str) -> String {
    let (pk, pv) = POOL_LABEL;
    let (sk, sv) = SYSTEM_LABEL;
    let Pool {
        nodes,
        cpus,
        mem_gib,
        gpus,
    } = pool;
    format!(
        r#"
apiVersion: tandem.dev/v1alpha1
kind: TandemCluster
metadata: {{name: {CLUSTER}}}
spec:
  controller:
    nodeSelector: {{{sk}: {sv}}}
  partitions: [{{name: gpu, default: true}}]
  accounts:
  - {{name: {RESEARCH}, shares: 60, users: [{{name: {researcher}, default: true}}]}}
  - {{name: {SERVING}, shares: 40}}
  bridge:
    namespaces: [{{namespace: {serving_ns}, account: {SERVING}}}]
---
apiVersion: tandem.dev/v1alpha1
kind: WorkerSet
metadata: {{name: gpu}}
spec:
  clusterName: {CLUSTER}
  replicas: {nodes}
  partitions: [gpu]
  cpus: {cpus}
  memory: {mem_gib}G
  gpus: {{count: {gpus}}}
  template:
    nodeSelector: {{{pk}: {pv}}}
    # Pool nodes carry the bridge's taint; the workers are the pool.
    tolerations: [{{key: tandem.dev/pool, operator: Exists, effect: NoSchedule}}]
---
apiVersion: tandem.dev/v1alpha1
kind: LoginSet
metadata: {{name: login}}
spec:
  clusterName: {CLUSTER}
  replicas: 1
  template:
    nodeSelector: {{{sk}: {sv}}}
"#
    )
}

/// The serving team's inference Deployment: `replicas` one-GPU pods scheduled by Tandem
/// (`schedulerName: tandem`), with a time limit annotation as a serving team would set.
pub fn inference(replicas: u32) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: infer}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: infer}}}}
  template:
    metadata:
      labels: {{app: infer}}
      annotations: {{tandem.dev/time-limit: "1:00:00"}}
    spec:
      schedulerName: tandem
      containers:
      - name: serve
        image: busybox
        command: [sh, -c, "echo serving on $(hostname); exec sleep 3600"]
        resources:
          requests: {{cpu: "1", memory: 1Gi}}
          limits: {{nvidia.com/gpu: "1"}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::objects_from_yaml;

    #[test]
    fn the_manifests_parse_into_the_kinds_the_story_applies() {
        let pool = Pool {
            nodes: 4,
            cpus: 8,
            mem_gib: 16,
            gpus: 2,
        };
        let objs = objects_from_yaml(&tandem_cluster(pool, "serving-1", "root")).unwrap();
        let kinds: Vec<&str> = objs
            .iter()
            .map(|o| o.types.as_ref().unwrap().kind.as_str())
            .collect();
        assert_eq!(kinds, ["TandemCluster", "WorkerSet", "LoginSet"]);
        let tc = &objs[0].data["spec"];
        assert_eq!(tc["bridge"]["namespaces"][0]["namespace"], "serving-1");
        assert_eq!(tc["accounts"][0]["users"][0]["name"], "root");
        assert_eq!(objs[1].data["spec"]["replicas"], 4);
        assert_eq!(objs[1].data["spec"]["gpus"]["count"], 2);
        let d = objects_from_yaml(&inference(2)).unwrap();
        assert_eq!(
            d[0].data["spec"]["template"]["spec"]["schedulerName"],
            "tandem"
        );
        assert_eq!(d[0].data["spec"]["replicas"], 2);
    }
}
