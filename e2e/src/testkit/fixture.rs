//! Fixtures built in code: [`PodFixture`], an RFC 7386 JSON merge, a pod's phase and exit
//! code, labels as a map. Apart from [`super::TestCluster`] because they are pure values
//! with no cluster behind them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// A Pod built in code: `PodFixture::new("p").node("n1").sh("echo hi").build()`.
#[derive(Debug, Clone)]
pub struct PodFixture {
    value: serde_json::Value,
}

impl PodFixture {
    /// One container `main` with image `busybox`, `restartPolicy: Never`.
    pub fn new(name: &str) -> Self {
        Self {
            value: json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            }),
        }
    }

    fn main(&mut self) -> &mut serde_json::Value {
        &mut self.value["spec"]["containers"][0]
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.value["metadata"]["namespace"] = json!(ns);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.value["metadata"]["labels"][key] = json!(value);
        self
    }

    /// Binds the pod to a node directly, as the scheduler's binding would.
    pub fn node(mut self, node: &str) -> Self {
        self.value["spec"]["nodeName"] = json!(node);
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.main()["image"] = json!(image);
        self
    }

    pub fn command(mut self, argv: &[&str]) -> Self {
        self.main()["command"] = json!(argv);
        self
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.main()["args"] = json!(args);
        self
    }

    /// `sh -c <script>`.
    pub fn sh(self, script: &str) -> Self {
        self.command(&["sh", "-c", script])
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        push(
            &mut self.main()["env"],
            json!({"name": name, "value": value}),
        );
        self
    }

    /// An env var from the downward API (`spec.nodeName`, `metadata.name`, ...).
    pub fn env_field(mut self, name: &str, field_path: &str) -> Self {
        push(
            &mut self.main()["env"],
            json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}),
        );
        self
    }

    /// A `nvidia.com/gpu` limit (requests default to it).
    pub fn gpus(mut self, n: u32) -> Self {
        self.main()["resources"]["limits"]["nvidia.com/gpu"] = json!(n.to_string());
        self
    }

    pub fn requests(mut self, cpu: &str, memory: &str) -> Self {
        self.main()["resources"]["requests"] = json!({"cpu": cpu, "memory": memory});
        self
    }

    /// `Never`, `OnFailure` or `Always`.
    pub fn restart(mut self, policy: &str) -> Self {
        self.value["spec"]["restartPolicy"] = json!(policy);
        self
    }

    pub fn grace(mut self, seconds: i64) -> Self {
        self.value["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
        self
    }

    /// Merges raw JSON into the pod (anything the helpers do not cover).
    pub fn merge(mut self, patch: serde_json::Value) -> Self {
        merge_json(&mut self.value, patch);
        self
    }

    pub fn build(self) -> Pod {
        serde_json::from_value(self.value).expect("PodFixture builds a valid Pod")
    }
}

fn push(slot: &mut serde_json::Value, item: serde_json::Value) {
    match slot {
        serde_json::Value::Array(items) => items.push(item),
        other => *other = json!([item]),
    }
}

/// RFC 7386 merge of `patch` into `target` (`null` removes a key).
pub fn merge_json(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge_json(t.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// The exit code of a pod's (first) terminated container, if any.
pub fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
}

/// The pod's phase, or `""`.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Labels as a map, for fixtures that take them.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
