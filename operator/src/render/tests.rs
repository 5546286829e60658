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
    let pod = controller_pod(&tc(), "cfg", "cert").unwrap();
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
    let other = controller_pod(&tc(), "cfg2", "cert").unwrap();
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
    // What net/src/endpoint.rs reads: the CA mounted in worker and login pods, and the
    // login pods' identity agent.
    assert_eq!(client["ca_file"], "/etc/tandem/ca/ca.crt");
    assert_eq!(client["auth_socket"], "/run/tandem/authd.sock");
    let file: tandem_net::endpoint::ClusterFile = serde_json::from_value(client.clone()).unwrap();
    assert_eq!(
        file.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/tandem/ca/ca.crt"))
    );
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
    // Its jobs' cgroups are its cluster's alone, even on a host tree another cluster shares.
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    assert!(
        has_pair(
            args,
            "--cgroup-subtree",
            &format!("{ns}.research.$(TANDEM_NODE_NAME)")
        ),
        "{args:?}"
    );
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
    /// Workers never request `nvidia.com/gpu` (nor limit it, which for an extended
    /// resource is a request): a worker holding its node's GPUs would make the kubelet
    /// refuse every bridged GPU pod there in `kube` mode (see the module's documentation).
    fn resources_requests_gpu_free(&self) -> bool {
        self.containers.iter().all(|c| {
            c.resources.as_ref().is_none_or(|r| {
                [&r.requests, &r.limits]
                    .iter()
                    .all(|q| q.as_ref().is_none_or(|q| !q.contains_key("nvidia.com/gpu")))
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
    let pod = login_pod(&ls(), 0, None).unwrap();
    assert_restricted(&pod);
    assert_no_key_material(&pod, "deadbeef");
    let env = pod.spec.as_ref().unwrap().containers[0]
        .env
        .as_ref()
        .unwrap();
    assert!(env.iter().any(|e| e.name == "TANDEM_CONFIG"
        && e.value.as_deref() == Some("/etc/tandem/config/cluster.json")));
}

fn args_of(c: &k8s_openapi::api::core::v1::Container) -> Vec<String> {
    c.args.clone().unwrap_or_default()
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// The volume named `name` of a pod.
fn volume<'a>(pod: &'a Pod, name: &str) -> &'a k8s_openapi::api::core::v1::Volume {
    pod.spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

/// Volume names a container mounts.
fn mounted(c: &k8s_openapi::api::core::v1::Container) -> Vec<String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.clone())
        .collect()
}

/// Names of the Secrets whose volumes a container mounts.
fn secrets_mounted(pod: &Pod, c: &k8s_openapi::api::core::v1::Container) -> Vec<String> {
    mounted(c)
        .iter()
        .filter_map(|v| volume(pod, v).secret.as_ref())
        .filter_map(|s| s.secret_name.clone())
        .collect()
}

#[test]
fn the_controller_speaks_tls_from_its_certificate_secret_and_serves_scaler_and_metrics() {
    let pod = controller_pod(&tc(), "cfg", "cert").unwrap();
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let args = args_of(c);
    assert!(has_pair(&args, "--tls-dir", TLS_DIR), "{args:?}");
    assert!(
        !args.iter().any(|a| a == "--insecure-plaintext"),
        "{args:?}"
    );
    assert!(has_pair(&args, "--scaler-listen", "$(POD_IP):9090"));
    assert!(has_pair(&args, "--metrics-listen", "$(POD_IP):9100"));
    let ports: Vec<(String, i32)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("grpc".to_owned(), i32::from(CONTROLLER_PORT)),
            ("scaler".to_owned(), i32::from(SCALER_PORT)),
            ("metrics".to_owned(), i32::from(METRICS_PORT)),
        ]
    );
    let tls = volume(&pod, "tls").secret.as_ref().unwrap();
    assert_eq!(tls.secret_name.as_deref(), Some("research-controller-tls"));
    assert_eq!(tls.default_mode, Some(0o400));
    assert!(
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "tls" && m.mount_path == TLS_DIR)
    );
    let reissued = controller_pod(&tc(), "cfg", "cert2").unwrap();
    assert_ne!(
        pod.metadata.annotations.as_ref().unwrap()[TEMPLATE_HASH],
        reissued.metadata.annotations.as_ref().unwrap()[TEMPLATE_HASH],
        "a reissued certificate restarts the controller"
    );
}

#[test]
fn the_service_exposes_grpc_scaler_and_metrics() {
    let svc = service(&tc()).unwrap();
    let ports: Vec<(String, i32)> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        [
            ("grpc".to_owned(), 6817),
            ("scaler".to_owned(), 9090),
            ("metrics".to_owned(), 9100),
        ]
    );
    assert!(!service_ports_differ(&svc));
    let mut old = svc.clone();
    old.spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    assert!(
        service_ports_differ(&old),
        "an older Service gets the new ports"
    );
}

#[test]
fn the_controller_certificate_names_the_service_and_its_cluster_ip() {
    let names = controller_cert_names("research-controller", "hpc", Some("10.96.0.10"));
    assert_eq!(
        names,
        [
            "research-controller",
            "research-controller.hpc",
            "research-controller.hpc.svc",
            "research-controller.hpc.svc.cluster.local",
            "10.96.0.10",
        ]
    );
    assert_eq!(controller_cert_names("s", "n", None).len(), 4);
}

#[test]
fn the_controller_certificate_is_reissued_only_when_its_names_or_ca_change() {
    let names = controller_cert_names("research-controller", "hpc", Some("10.96.0.10"));
    assert!(cert_needs_issue(&names, "CA1", None), "none yet");
    let issued = controller_tls_secret(&tc(), &names, "CERT", "KEY", "CA1").unwrap();
    assert_eq!(issued.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = issued.data.as_ref().unwrap();
    assert_eq!(data["tls.crt"].0, b"CERT");
    assert_eq!(data["tls.key"].0, b"KEY");
    assert_eq!(data["ca.crt"].0, b"CA1");
    assert!(!cert_needs_issue(&names, "CA1", Some(&issued)), "current");

    let moved = controller_cert_names("research-controller", "hpc", Some("10.96.0.11"));
    assert!(
        cert_needs_issue(&moved, "CA1", Some(&issued)),
        "the clusterIP changed"
    );
    assert!(
        cert_needs_issue(&names, "CA2", Some(&issued)),
        "another CA issued it"
    );
    let mut emptied = issued.clone();
    emptied.data.as_mut().unwrap().remove("tls.key");
    assert!(cert_needs_issue(&names, "CA1", Some(&emptied)), "no key");
    let mut unannotated = issued;
    unannotated.metadata.annotations = None;
    assert!(cert_needs_issue(&names, "CA1", Some(&unannotated)));

    assert_ne!(
        controller_cert_id(&names, "CA1"),
        controller_cert_id(&moved, "CA1")
    );
    assert_ne!(
        controller_cert_id(&names, "CA1"),
        controller_cert_id(&names, "CA2")
    );
}

#[test]
fn the_ca_lives_in_its_own_secret() {
    let s = ca_secret(&tc(), "CERT", "KEY").unwrap();
    assert_eq!(s.metadata.name.as_deref(), Some("research-ca"));
    let data = s.data.as_ref().unwrap();
    assert_eq!(data["ca.crt"].0, b"CERT");
    assert_eq!(data["ca.key"].0, b"KEY");
    assert_eq!(
        s.metadata.owner_references.as_ref().unwrap()[0].kind,
        "TandemCluster"
    );
}

#[test]
fn a_worker_takes_its_step_certificate_from_its_node_secret_and_never_mounts_the_ca_key() {
    for w in [ws(), {
        let mut w = ws();
        w.spec.template.run_as = Some(crate::crd::template::RunAs {
            user: 1000,
            group: 1000,
        });
        w
    }] {
        let pod = worker_pod(&w, "gpu-07", None).unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let args = args_of(c);
        assert!(has_pair(&args, "--tls-dir", STEP_TLS_DIR), "{args:?}");
        assert!(has_pair(&args, "--name", "$(TANDEM_NODE_NAME)"), "{args:?}");
        assert!(has_pair(&args, "--step-listen", "$(POD_IP):6818"));
        for absent in ["--tls-issue-from", "--insecure-plaintext"] {
            assert!(!args.iter().any(|a| a == absent), "{absent}: {args:?}");
        }
        // The node name the worker registers as is the node the pod is pinned to, and the
        // one its certificate is issued for.
        let env = c.env.as_ref().unwrap();
        let node_env = env.iter().find(|e| e.name == "TANDEM_NODE_NAME").unwrap();
        let field = node_env.value_from.as_ref().unwrap().field_ref.as_ref();
        assert_eq!(field.unwrap().field_path, "spec.nodeName");

        // The CA Secret: its certificate only, never its key, in any volume or projection.
        let ca = volume(&pod, "tandem-ca").secret.as_ref().unwrap();
        assert_eq!(ca.secret_name.as_deref(), Some("research-ca"));
        let items: Vec<(&str, &str)> = ca
            .items
            .iter()
            .flatten()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect();
        assert_eq!(items, [("ca.crt", "ca.crt")], "never ca.key");
        let volumes = serde_json::to_string(&pod.spec.as_ref().unwrap().volumes).unwrap();
        assert!(!volumes.contains(CA_KEY_FILE), "{volumes}");

        // The step certificate: this node's own Secret.
        let step = volume(&pod, "step-tls").secret.as_ref().unwrap();
        assert_eq!(
            step.secret_name.as_deref(),
            Some("a100-gpu-07-step-tls"),
            "named after the pod"
        );
        assert_eq!(step.default_mode, Some(0o400));
        assert!(step.items.is_none(), "tls.crt, tls.key and ca.crt");
        let mounts: Vec<(&str, &str)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert!(mounts.contains(&("tandem-ca", CA_DIR)), "{mounts:?}");
        assert!(mounts.contains(&("step-tls", STEP_TLS_DIR)), "{mounts:?}");
        let secrets = secrets_mounted(&pod, c);
        assert_eq!(
            secrets,
            ["research-key", "research-ca", "a100-gpu-07-step-tls"],
            "{secrets:?}"
        );
    }
}

#[test]
fn a_worker_step_secret_is_issued_for_the_node_name_and_owned_by_its_set() {
    let w = ws();
    assert_eq!(step_cert_names("gpu-07"), ["gpu-07"]);
    let s = worker_step_tls_secret(&w, "gpu-07", "CERT", "KEY", "CA1").unwrap();
    assert_eq!(s.metadata.name.as_deref(), Some("a100-gpu-07-step-tls"));
    assert_eq!(s.metadata.namespace.as_deref(), Some("hpc"));
    assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = s.data.as_ref().unwrap();
    assert_eq!(data["tls.crt"].0, b"CERT");
    assert_eq!(data["tls.key"].0, b"KEY");
    assert_eq!(data["ca.crt"].0, b"CA1");
    assert_eq!(data.len(), 3, "no CA key");
    let owners = s.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].uid.as_str()),
        ("WorkerSet", "uid-2")
    );
    let l = s.metadata.labels.as_ref().unwrap();
    assert_eq!(l[WORKER_SET], "a100");
    assert_eq!(l[CLUSTER], "research");
    assert!(!cert_needs_issue(
        &step_cert_names("gpu-07"),
        "CA1",
        Some(&s)
    ));
    assert!(cert_needs_issue(
        &step_cert_names("gpu-08"),
        "CA1",
        Some(&s)
    ));

    // Long names stay a valid object name, and still end in the suffix.
    let long = "n".repeat(250);
    let name = worker_step_tls_secret_name("a100", &long);
    assert!(name.len() <= 253 && name.ends_with("-step-tls"), "{name}");
}

fn ls() -> LoginSet {
    let mut ls = LoginSet::new(
        "login",
        LoginSetSpec {
            cluster_name: "research".into(),
            replicas: 1,
            template: Default::default(),
        },
    );
    ls.metadata.namespace = Some("hpc".into());
    ls
}

#[test]
fn login_users_get_an_identity_agent_and_never_the_key() {
    let pod = login_pod(&ls(), 0, None).unwrap();
    assert_restricted(&pod);
    let spec = pod.spec.as_ref().unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["login", "authd"]);
    let (login, agent) = (&spec.containers[0], &spec.containers[1]);
    assert_eq!(
        pod.metadata.annotations.as_ref().unwrap()[DEFAULT_CONTAINER],
        "login",
        "kubectl exec lands in the login container"
    );

    // The key: only the agent mounts it. The CA: only its certificate, only in login.
    assert_eq!(secrets_mounted(&pod, agent), ["research-key"]);
    assert_eq!(secrets_mounted(&pod, login), ["research-ca"]);
    let ca = volume(&pod, "tandem-ca").secret.as_ref().unwrap();
    let items: Vec<&str> = ca.items.iter().flatten().map(|i| i.key.as_str()).collect();
    assert_eq!(items, ["ca.crt"], "never ca.key");

    // Different non-root uids: login users cannot read the agent's files or process.
    let pod_uid = spec.security_context.as_ref().unwrap().run_as_user;
    let agent_sc = agent.security_context.as_ref().unwrap();
    assert_eq!(pod_uid, Some(NONROOT));
    assert!(
        login
            .security_context
            .as_ref()
            .unwrap()
            .run_as_user
            .is_none()
    );
    assert!(
        agent_sc
            .run_as_user
            .is_some_and(|u| u > 0 && Some(u) != pod_uid)
    );
    assert_ne!(spec.share_process_namespace, Some(true));

    // The agent's socket: an emptyDir both mount, read-only for the users.
    let auth = volume(&pod, "tandem-auth");
    assert!(auth.empty_dir.is_some());
    let mount = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "tandem-auth")
            .cloned()
            .unwrap()
    };
    assert_eq!(mount(login).mount_path, AUTH_DIR);
    assert_eq!(mount(login).read_only, Some(true));
    assert_eq!(mount(agent).mount_path, AUTH_DIR);
    assert_ne!(mount(agent).read_only, Some(true));
    let args = args_of(agent);
    assert_eq!(args[0], "authd");
    assert!(has_pair(&args, "--key-file", "/etc/tandem/key/cluster.key"));
    assert!(has_pair(&args, "--socket", "/run/tandem/authd.sock"));
}

#[test]
fn the_agent_never_shares_the_login_users_uid() {
    let mut l = ls();
    l.spec.template.run_as = Some(crate::crd::template::RunAs {
        user: AUTHD_UID,
        group: 1000,
    });
    let pod = login_pod(&l, 0, None).unwrap();
    let agent = &pod.spec.as_ref().unwrap().containers[1];
    let uid = agent.security_context.as_ref().unwrap().run_as_user;
    assert!(uid.is_some_and(|u| u != AUTHD_UID && u > 0), "{uid:?}");
}

/// Pool nodes carry `tandem.dev/pool:NoExecute` in batch mode: a worker must tolerate the
/// pool key with every effect and no deadline, whatever its template says, and the pool
/// toleration must be the first to match (the taint manager honours the first match's
/// `tolerationSeconds`).
#[test]
fn a_worker_tolerates_the_pool_taint_with_every_effect_whatever_its_template_says() {
    let pool =
        |effect: Option<&str>, seconds: Option<i64>| k8s_openapi::api::core::v1::Toleration {
            key: Some("tandem.dev/pool".into()),
            operator: Some("Exists".into()),
            effect: effect.map(str::to_owned),
            toleration_seconds: seconds,
            ..Default::default()
        };
    let other = k8s_openapi::api::core::v1::Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    };
    for template in [
        vec![],
        vec![pool(Some("NoSchedule"), None)],
        vec![other.clone(), pool(Some("NoExecute"), Some(300))],
        vec![pool(None, None)],
    ] {
        let mut w = ws();
        w.spec.template.tolerations = template.clone();
        let pod = worker_pod(&w, "gpu-07", None).unwrap();
        let tols = pod.spec.as_ref().unwrap().tolerations.clone().unwrap();
        assert_eq!(tols[0], pool(None, None), "{template:?} -> {tols:?}");
        assert!(has_pool_toleration(&pod));
        // No other toleration of the pool key (one with a deadline would be a trap).
        assert_eq!(
            tols.iter()
                .filter(|t| t.key.as_deref() == Some("tandem.dev/pool"))
                .count(),
            1,
            "{tols:?}"
        );
        // Other keys are kept as written.
        assert_eq!(tols.contains(&other), template.contains(&other), "{tols:?}");
        // The toleration is no template change: no rollout of running workers.
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[TEMPLATE_HASH],
            worker_template_hash(&w, &default_image())
        );
    }
    // Control-plane pods stay off pool nodes.
    let controller = controller_pod(&tc(), "cfg", "cert").unwrap();
    assert!(!has_pool_toleration(&controller));
    assert!(!has_pool_toleration(&login_pod(&ls(), 0, None).unwrap()));
}

/// A worker pod made before the toleration existed gets it added in place: its own list
/// first (the API server allows only additions), guarded by its resourceVersion.
#[test]
fn an_older_worker_pod_gets_the_pool_toleration_added_in_place() {
    let mut w = ws();
    w.spec.template.tolerations = vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("tandem.dev/pool".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }];
    let mut pod = worker_pod(&w, "gpu-07", None).unwrap();
    let old = w.spec.template.tolerations.clone();
    pod.spec.as_mut().unwrap().tolerations = Some(old.clone());
    pod.metadata.resource_version = Some("42".into());
    assert!(!has_pool_toleration(&pod));
    let patch = pool_toleration_patch(&pod);
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
    let patched: Vec<k8s_openapi::api::core::v1::Toleration> =
        serde_json::from_value(patch["spec"]["tolerations"].clone()).unwrap();
    assert_eq!(patched[..1], old[..]);
    assert_eq!(patched[1], pool_toleration());
    pod.spec.as_mut().unwrap().tolerations = Some(patched);
    assert!(has_pool_toleration(&pod));
}
