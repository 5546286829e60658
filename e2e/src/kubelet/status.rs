//! Pod status as a kubelet computes it (pure): phase from container states and the restart
//! policy, the four standard conditions, and container statuses.
//!
//! The pod worker keeps a [`ContainerRecord`] per container and calls [`build`] after every
//! change; the result is written whole to the `status` subresource.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The state of one container, as the runtime would report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Termination),
}

/// How a container instance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Termination {
    pub exit_code: i32,
    /// `Completed`, `Error`, `StartError`, `ContainerStatusUnknown`.
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: Option<String>,
}

impl Termination {
    /// A process that exited: `Completed` for 0, else `Error` (a runtime's reasons).
    pub fn exited(
        exit_code: i32,
        started_at: Timestamp,
        finished_at: Timestamp,
        id: String,
    ) -> Self {
        Self {
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: Some(started_at),
            finished_at,
            container_id: Some(id),
        }
    }
}

/// One container slot of a pod across its restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    pub name: String,
    pub image: String,
    pub state: State,
    /// The previous instance's end, once it has restarted (`lastState`).
    pub last: Option<Termination>,
    pub restarts: i32,
    pub container_id: Option<String>,
    /// The readiness probe's verdict (true for a container without one) while running.
    pub ready: bool,
}

impl ContainerRecord {
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.to_owned(),
            image: image.to_owned(),
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            last: None,
            restarts: 0,
            container_id: None,
            ready: true,
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    pub fn is_ready(&self) -> bool {
        self.is_running() && self.ready
    }

    pub fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(t) if t.exit_code == 0)
    }
}

/// A pod's runtime view: what the kubelet knows beyond the API object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRuntime {
    pub init: Vec<ContainerRecord>,
    pub containers: Vec<ContainerRecord>,
    pub start_time: Timestamp,
    pub host_ip: String,
    pub pod_ip: String,
    /// Set once the pod is being torn down (deleted, or past its active deadline): its
    /// containers will not be restarted, so the phase must become terminal.
    pub terminal: bool,
    /// Pod-level `status.reason`/`status.message` (e.g. `DeadlineExceeded`).
    pub reason: Option<(String, String)>,
}

/// `PodPhase` by the kubelet's rules.
pub fn phase(restart_policy: &str, rt: &PodRuntime) -> &'static str {
    if !rt.init.iter().all(ContainerRecord::succeeded) {
        let init_failed = rt.init.iter().any(|c| match &c.state {
            State::Terminated(t) => t.exit_code != 0,
            State::Waiting { .. } => c.last.is_some(),
            State::Running { .. } => false,
        });
        if rt.terminal || (init_failed && restart_policy == "Never") {
            return "Failed";
        }
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &rt.containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } if c.last.is_some() => stopped += 1,
            State::Waiting { .. } => waiting += 1,
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped == 0 {
        return "Pending";
    }
    if rt.terminal || restart_policy == "Never" {
        return if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if restart_policy == "OnFailure" && stopped == succeeded {
        return "Succeeded";
    }
    "Running"
}

/// `QOSClass` from the containers' requests and limits.
pub fn qos_class(pod: &Pod) -> &'static str {
    let containers = pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    let (mut any, mut guaranteed) = (false, true);
    for c in containers {
        let res = c.resources.as_ref();
        let req = res.and_then(|r| r.requests.as_ref());
        let lim = res.and_then(|r| r.limits.as_ref());
        any |= req.is_some_and(|m| !m.is_empty()) || lim.is_some_and(|m| !m.is_empty());
        for name in ["cpu", "memory"] {
            let l = lim.and_then(|m| m.get(name));
            let r = req.and_then(|m| m.get(name)).or(l);
            if l.is_none() || r != l {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// The whole status for `pod` given the kubelet's view, at `now`. Condition transition
/// times are carried over from the pod's current status when the condition did not change.
pub fn build(pod: &Pod, rt: &PodRuntime, now: Timestamp) -> PodStatus {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    // A pod the kubelet ended for a reason of its own (DeadlineExceeded) fails whatever
    // its containers' exit codes.
    let phase = if rt.terminal && rt.reason.is_some() {
        "Failed"
    } else {
        phase(policy, rt)
    };
    let finished = matches!(phase, "Succeeded" | "Failed");
    let previous = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = |type_: &str, ok: bool, reason: Option<String>, message: Option<String>| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason,
            message,
            last_transition_time: Some(since),
            observed_generation: pod.metadata.generation,
            ..PodCondition::default()
        }
    };
    let unfinished_init: Vec<&str> = rt
        .init
        .iter()
        .filter(|c| !c.succeeded())
        .map(|c| c.name.as_str())
        .collect();
    let unready: Vec<&str> = rt
        .containers
        .iter()
        .filter(|c| !c.is_ready())
        .map(|c| c.name.as_str())
        .collect();
    let list = |names: &[&str]| format!("[{}]", names.join(" "));
    let initialized = if unfinished_init.is_empty() {
        condition("Initialized", true, None, None)
    } else {
        let msg = format!(
            "containers with incomplete status: {}",
            list(&unfinished_init)
        );
        condition(
            "Initialized",
            false,
            Some("ContainersNotInitialized".into()),
            Some(msg),
        )
    };
    let readiness = |type_: &str| {
        if finished {
            condition(type_, false, Some("PodCompleted".into()), None)
        } else if unready.is_empty() {
            condition(type_, true, None, None)
        } else {
            let msg = format!("containers with unready status: {}", list(&unready));
            condition(type_, false, Some("ContainersNotReady".into()), Some(msg))
        }
    };
    let conditions = vec![
        condition("PodReadyToStartContainers", !finished, None, None),
        initialized,
        readiness("Ready"),
        readiness("ContainersReady"),
        condition("PodScheduled", true, None, None),
    ];
    let (reason, message) = rt.reason.clone().unzip();
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: Some(rt.host_ip.clone()),
        host_ips: Some(vec![HostIP {
            ip: rt.host_ip.clone(),
        }]),
        pod_ip: Some(rt.pod_ip.clone()),
        pod_ips: Some(vec![PodIP {
            ip: rt.pod_ip.clone(),
        }]),
        start_time: Some(Time(rt.start_time)),
        qos_class: Some(qos_class(pod).into()),
        init_container_statuses: (!rt.init.is_empty()).then(|| statuses(&rt.init, false)),
        container_statuses: Some(statuses(&rt.containers, !finished)),
        observed_generation: pod.metadata.generation,
        reason,
        message,
        ..PodStatus::default()
    }
}

/// Container statuses sorted by name, as the kubelet sorts them.
fn statuses(records: &[ContainerRecord], may_be_ready: bool) -> Vec<ContainerStatus> {
    let mut out: Vec<ContainerStatus> = records
        .iter()
        .map(|c| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone(),
            image_id: String::new(),
            container_id: c.container_id.clone(),
            ready: may_be_ready && c.is_ready(),
            started: Some(c.is_running()),
            restart_count: c.restarts,
            state: Some(to_api(&c.state)),
            last_state: Some(
                c.last
                    .as_ref()
                    .map(|t| to_api(&State::Terminated(t.clone())))
                    .unwrap_or_default(),
            ),
            ..ContainerStatus::default()
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn to_api(state: &State) -> ContainerState {
    match state {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..ContainerState::default()
        },
        State::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..ContainerState::default()
        },
        State::Terminated(t) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: t.exit_code,
                reason: Some(t.reason.clone()),
                message: t.message.clone(),
                started_at: t.started_at.map(Time),
                finished_at: Some(Time(t.finished_at)),
                container_id: t.container_id.clone(),
                signal: None,
            }),
            ..ContainerState::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn running() -> State {
        State::Running { started_at: t(1) }
    }

    fn exited(code: i32) -> State {
        State::Terminated(Termination::exited(code, t(1), t(2), "process://1".into()))
    }

    fn waiting(reason: &str) -> State {
        State::Waiting {
            reason: reason.into(),
            message: None,
        }
    }

    fn rt(states: Vec<State>) -> PodRuntime {
        PodRuntime {
            init: vec![],
            containers: states
                .into_iter()
                .enumerate()
                .map(|(i, state)| ContainerRecord {
                    state,
                    ..ContainerRecord::new(&format!("c{i}"), "busybox")
                })
                .collect(),
            start_time: t(0),
            host_ip: "127.0.0.1".into(),
            pod_ip: "127.0.0.1".into(),
            terminal: false,
            reason: None,
        }
    }

    #[test]
    fn phase_table() {
        struct Case {
            name: &'static str,
            policy: &'static str,
            states: Vec<State>,
            restarted: bool,
            terminal: bool,
            want: &'static str,
        }
        let case = |name, policy, states, want| Case {
            name,
            policy,
            states,
            restarted: false,
            terminal: false,
            want,
        };
        let cases = [
            case(
                "creating is pending",
                "Never",
                vec![waiting("ContainerCreating")],
                "Pending",
            ),
            case(
                "one running is running",
                "Never",
                vec![running(), exited(0)],
                "Running",
            ),
            case(
                "never: a failure fails the pod",
                "Never",
                vec![exited(0), exited(3)],
                "Failed",
            ),
            case(
                "never: all zero succeeds",
                "Never",
                vec![exited(0), exited(0)],
                "Succeeded",
            ),
            case(
                "on-failure: all zero succeeds",
                "OnFailure",
                vec![exited(0)],
                "Succeeded",
            ),
            case(
                "on-failure: a failure will restart",
                "OnFailure",
                vec![exited(1)],
                "Running",
            ),
            case(
                "always: exited will restart",
                "Always",
                vec![exited(0)],
                "Running",
            ),
            Case {
                restarted: true,
                ..case(
                    "crash loop counts as stopped",
                    "Always",
                    vec![waiting("CrashLoopBackOff")],
                    "Running",
                )
            },
            Case {
                terminal: true,
                ..case(
                    "deleted always-pod ends by exit codes",
                    "Always",
                    vec![exited(143)],
                    "Failed",
                )
            },
            Case {
                terminal: true,
                ..case(
                    "deleted clean exit succeeds",
                    "Always",
                    vec![exited(0)],
                    "Succeeded",
                )
            },
        ];
        for c in cases {
            let mut r = rt(c.states);
            r.terminal = c.terminal;
            if c.restarted {
                r.containers[0].last = Some(Termination::exited(1, t(1), t(2), "x".into()));
            }
            assert_eq!(phase(c.policy, &r), c.want, "{}", c.name);
        }
    }

    #[test]
    fn init_containers_gate_the_pod() {
        let mut r = rt(vec![waiting("PodInitializing")]);
        r.init = vec![ContainerRecord {
            state: exited(1),
            ..ContainerRecord::new("init", "busybox")
        }];
        assert_eq!(phase("Never", &r), "Failed");
        assert_eq!(phase("OnFailure", &r), "Pending");
        r.init[0].state = exited(0);
        assert_eq!(
            phase("Never", &r),
            "Pending",
            "main container still waiting"
        );
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "generation": 1},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c0", "image": "busybox"}]},
            "status": {"conditions": [{"type": "Initialized", "status": "True",
                                        "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    fn cond<'a>(s: &'a PodStatus, type_: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap()
    }

    #[test]
    fn running_pod_is_ready_and_keeps_transition_times() {
        let s = build(&pod(), &rt(vec![running()]), t(5));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "ContainersReady").status, "True");
        assert_eq!(cond(&s, "PodScheduled").status, "True");
        let init = cond(&s, "Initialized");
        assert_eq!(
            init.last_transition_time.as_ref().unwrap().0.to_string(),
            "2020-01-01T00:00:00Z"
        );
        assert_eq!(cond(&s, "Ready").last_transition_time, Some(Time(t(5))));
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready && cs.started == Some(true));
        assert!(cs.state.as_ref().unwrap().running.is_some());
        assert_eq!(s.pod_ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn failed_pod_reports_exit_code_and_pod_completed() {
        let s = build(&pod(), &rt(vec![exited(3)]), t(5));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        let ready = cond(&s, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("PodCompleted"))
        );
        let term = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));
    }

    #[test]
    fn a_pod_ended_by_the_kubelet_fails_even_if_its_containers_exited_zero() {
        let mut r = rt(vec![exited(0)]);
        r.terminal = true;
        r.reason = Some((
            "DeadlineExceeded".into(),
            "Pod was active on the node longer than the specified deadline".into(),
        ));
        let s = build(&pod(), &r, t(5));
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    }

    #[test]
    fn waiting_pod_names_unready_containers() {
        let s = build(&pod(), &rt(vec![waiting("ErrImagePull")]), t(5));
        let ready = cond(&s, "ContainersReady");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [c0]")
        );
    }

    #[test]
    fn qos_classes() {
        let with = |res: serde_json::Value| -> Pod {
            serde_json::from_value(
                json!({"spec": {"containers": [{"name": "c", "resources": res}]}}),
            )
            .unwrap()
        };
        assert_eq!(qos_class(&with(json!({}))), "BestEffort");
        assert_eq!(
            qos_class(&with(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&with(json!({"requests": {"cpu": "1"}}))),
            "Burstable"
        );
    }
}
