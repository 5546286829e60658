//! What is not a chart's: the names the story's values and nodes share, the pool's shape,
//! and the serving team's inference Deployment through the bridge (the `tandem-cluster`
//! objects come from the chart, with [`super::values::cluster`]). Pure: names in, YAML out.

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
    fn the_inference_deployment_is_scheduled_by_tandem() {
        let d = objects_from_yaml(&inference(2)).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].data["spec"]["template"]["spec"]["schedulerName"],
            "tandem"
        );
        assert_eq!(d[0].data["spec"]["replicas"], 2);
    }
}
