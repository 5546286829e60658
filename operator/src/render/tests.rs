use super::*;
use crate::crd::cluster::PartitionSpec;
use crate::crd::workerset::GpuShape;
use crate::crd::{LoginSetSpec, TandemClusterSpec, WorkerSetSpec};

fn tc() -> TandemCluster {
    let mut tc = TandemCluster::new(
        "research",
        TandemClusterSpec {
            partitions: vec![PartitionSpec {
                name: "gpu".into(),
                default: true,
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    tc.metadata.namespace = Some("hpc".into());
    tc.metadata.uid = Some("uid-1".into());
    tc
}

fn ws() -> WorkerSet {
    let mut ws = WorkerSet::new(
        "a100",
        WorkerSetSpec {
            cluster_name: "research".into(),
            replicas: 3,
            partitions: vec!["gpu".into()],
            gpus: Some(GpuShape {
                count: Some(8),
                gpu_type: Some("a100".into()),
            }),
            ..Default::default()
        },
    );
    ws.metadata.namespace = Some("hpc".into());
    ws.metadata.uid = Some("uid-2".into());
    ws
}

fn rendered() -> Rendered {
    crate::partitions::render(&tc().spec.partitions, &[], &Default::default())
}

fn assert_restricted(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    for c in &spec.containers {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert!(sc.capabilities.as_ref().unwrap().add.is_none());
        assert_ne!(sc.privileged, Some(true));
    }
}

/// The key reaches pods only as a mounted Secret file: never in env, args or a ConfigMap.
fn assert_no_key_material(pod: &Pod, key_hex: &str) {
    let text = serde_json::to_string(pod).unwrap();
    assert!(!text.contains(key_hex));
    let spec = pod.spec.as_ref().unwrap();
    assert!(spec.volumes.iter().flatten().any(|v| {
        v.secret
            .as_ref()
            .is_some_and(|s| s.secret_name.as_deref() == Some("research-key"))
    }));
    for c in &spec.containers {
        for e in c.env.iter().flatten() {
            assert!(
                e.value_from
                    .as_ref()
                    .is_none_or(|v| v.secret_key_ref.is_none()),
                "{e:?}"
            );
        }
    }
}

#[test]
fn the_controller_pod_is_restricted_and_mounts_key_config_and_store() {
    let pod = controller_pod(&tc(), "cfg").unwrap();
    assert_restricted(&pod);
    assert_no_key_material(&pod, "deadbeef");
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let args = c.args.as_ref().unwrap();
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--listen" && w[1] == "$(POD_IP):6817"),
        "{args:?}"
    );
    assert!(args.contains(&"/etc/tandem/key/cluster.key".to_owned()));
    let other = controller_pod(&tc(), "cfg2").unwrap();
    assert_ne!(
        pod.metadata.annotations.as_ref().unwrap()[TEMPLATE_HASH],
        other.metadata.annotations.as_ref().unwrap()[TEMPLATE_HASH],
        "a config change restarts the controller"
    );
    assert_eq!(
        pod.metadata.owner_references.as_ref().unwrap()[0].kind,
        "TandemCluster"
    );
}

#[test]
fn the_key_lives_in_a_secret_and_the_config_map_has_none() {
    let s = key_secret(&tc(), "deadbeef").unwrap();
    assert_eq!(s.string_data.as_ref().unwrap()["cluster.key"], "deadbeef\n");
    let cm = config_map(&tc(), &rendered(), Some("http://10.0.0.1:6817")).unwrap();
    let text = serde_json::to_string(&cm).unwrap();
    assert!(!text.contains("deadbeef"));
    let client: serde_json::Value =
        serde_json::from_str(&cm.data.as_ref().unwrap()["cluster.json"]).unwrap();
    assert_eq!(client["controller"], "http://10.0.0.1:6817");
    assert_eq!(client["key_file"], "/etc/tandem/key/cluster.key");
    let toml = &cm.data.as_ref().unwrap()["controller.toml"];
    assert!(toml.contains("name = \"gpu\""), "{toml}");
    // The controller's own parser accepts it (same spelling as its --config file).
    let parsed: toml::Table = toml::from_str(toml).unwrap();
    assert_eq!(parsed["cluster_name"].as_str(), Some("research"));
}

#[test]
fn a_worker_is_named_after_its_node_pinned_to_it_and_unprivileged() {
    let pod = worker_pod(&ws(), "gpu-07", None).unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("a100-gpu-07"));
    let spec = pod.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    let args = c.args.as_ref().unwrap();
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--name" && w[1] == "$(TANDEM_NODE_NAME)")
    );
    assert!(args.windows(2).any(|w| w[0] == "--gpus" && w[1] == "8"));
    let env = c.env.as_ref().unwrap();
    let node_env = env.iter().find(|e| e.name == "TANDEM_NODE_NAME").unwrap();
    assert_eq!(
        node_env
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    let terms = &spec
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        terms[0].match_fields.as_ref().unwrap()[0].values.as_deref(),
        Some(&["gpu-07".to_owned()][..])
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_no_key_material(&pod, "deadbeef");
    assert!(spec.resources_requests_gpu_free());
    assert_eq!(pod.metadata.labels.as_ref().unwrap()[WORKER_SET], "a100");
}

trait NoGpuRequest {
    fn resources_requests_gpu_free(&self) -> bool;
}
impl NoGpuRequest for k8s_openapi::api::core::v1::PodSpec {
    /// Workers never request `nvidia.com/gpu`: node modes keep batch and bridged pods apart.
    fn resources_requests_gpu_free(&self) -> bool {
        self.containers.iter().all(|c| {
            c.resources.as_ref().is_none_or(|r| {
                r.requests
                    .as_ref()
                    .is_none_or(|q| !q.contains_key("nvidia.com/gpu"))
            })
        })
    }
}

#[test]
fn a_worker_run_as_a_user_passes_restricted() {
    let mut w = ws();
    w.spec.template.run_as = Some(crate::crd::template::RunAs {
        user: 1000,
        group: 1000,
    });
    let pod = worker_pod(&w, "n1", None).unwrap();
    assert_restricted(&pod);
    assert_eq!(
        pod.spec
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap()
            .run_as_user,
        Some(1000)
    );
}

#[test]
fn template_changes_change_the_hash_replicas_do_not() {
    let a = worker_template_hash(&ws(), "img");
    let mut w = ws();
    w.spec.replicas = 100;
    assert_eq!(
        worker_template_hash(&w, "img"),
        a,
        "scaling is not a rollout"
    );
    w.spec.features.push("ib".into());
    assert_ne!(worker_template_hash(&w, "img"), a);
    assert_ne!(worker_template_hash(&ws(), "img2"), a);
}

#[test]
fn login_pods_are_restricted_and_configured_through_tandem_config() {
    let mut ls = LoginSet::new(
        "login",
        LoginSetSpec {
            cluster_name: "research".into(),
            replicas: 1,
            template: Default::default(),
        },
    );
    ls.metadata.namespace = Some("hpc".into());
    let pod = login_pod(&ls, 0, None).unwrap();
    assert_restricted(&pod);
    assert_no_key_material(&pod, "deadbeef");
    let env = pod.spec.as_ref().unwrap().containers[0]
        .env
        .as_ref()
        .unwrap();
    assert!(env.iter().any(|e| e.name == "TANDEM_CONFIG"
        && e.value.as_deref() == Some("/etc/tandem/config/cluster.json")));
}
