//! Fluent builders for tests, benches and the simulator: `JobSpec::test().gpus(8).nodes(2)`,
//! `NodeRegistration::test("gpu-01", 64, 512_000, 8)`, `State::test_cluster(4, 64, 512_000, 8)`.

use crate::array::ArraySpec;
use crate::config::ClusterConfig;
use crate::constraint::Constraint;
use crate::dependency::Dependency;
use crate::job::{Job, JobSpec, NodeCaps};
use crate::node::NodeMode;
use crate::state::{NodeRegistration, State};
use crate::{JobId, Tres};

impl JobSpec {
    /// One task, one CPU, user `alice` (uid 1000), one hour, default partition.
    pub fn test() -> JobSpec {
        JobSpec {
            name: "job".into(),
            user: "alice".into(),
            uid: 1000,
            gid: 1000,
            time_limit: Some(3600),
            ..JobSpec::default()
        }
    }
    pub fn user(mut self, user: &str) -> Self {
        self.user = user.into();
        self
    }
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }
    pub fn account(mut self, a: &str) -> Self {
        self.account = a.into();
        self
    }
    pub fn partition(mut self, p: &str) -> Self {
        self.partition = p.into();
        self
    }
    pub fn qos(mut self, q: &str) -> Self {
        self.qos = q.into();
        self
    }
    /// Time limit in seconds; `None` = not given.
    pub fn time(mut self, secs: Option<u64>) -> Self {
        self.time_limit = secs;
        self
    }
    pub fn nodes(mut self, n: u32) -> Self {
        self.nodes_min = n;
        self
    }
    pub fn ntasks(mut self, n: u32) -> Self {
        self.ntasks = n;
        self
    }
    pub fn cpus_per_task(mut self, n: u32) -> Self {
        self.cpus_per_task = n;
        self
    }
    pub fn mem_mb(mut self, mb: u64) -> Self {
        self.mem_per_node_mb = Some(mb);
        self
    }
    pub fn mem_per_cpu(mut self, mb: u64) -> Self {
        self.mem_per_cpu_mb = Some(mb);
        self
    }
    pub fn gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }
    pub fn gpus_per_node(mut self, n: u32) -> Self {
        self.gpus_per_node = n;
        self
    }
    pub fn gpu_type(mut self, t: &str) -> Self {
        self.gpu_type = Some(t.into());
        self
    }
    pub fn exclusive(mut self) -> Self {
        self.exclusive = true;
        self
    }
    pub fn kube(mut self) -> Self {
        self.mode = NodeMode::Kube;
        self
    }
    pub fn held(mut self) -> Self {
        self.hold = true;
        self
    }
    pub fn begin(mut self, t: i64) -> Self {
        self.begin = Some(t);
        self
    }
    pub fn no_requeue(mut self) -> Self {
        self.requeue = Some(false);
        self
    }
    /// Panics on a bad spec: for tests.
    pub fn array(mut self, spec: &str) -> Self {
        self.array = Some(Box::new(ArraySpec::parse(spec).expect("test array spec")));
        self
    }
    /// Panics on a bad expression: for tests.
    pub fn dependency(mut self, expr: &str) -> Self {
        self.dependency = Some(Box::new(Dependency::parse(expr).expect("test dependency")));
        self
    }
    /// Panics on a bad expression: for tests.
    pub fn constraint(mut self, expr: &str) -> Self {
        self.constraint = Some(Box::new(Constraint::parse(expr).expect("test constraint")));
        self
    }
    pub fn nodelist(mut self, names: &[&str]) -> Self {
        self.nodelist = names.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn with(mut self, f: impl FnOnce(&mut JobSpec)) -> Self {
        f(&mut self);
        self
    }
}

impl Job {
    /// A PENDING record of `spec`, submitted at 0, shape from a 64-CPU, 8-GPU node.
    pub fn test(id: JobId, spec: JobSpec) -> Job {
        let shape = spec.shape(NodeCaps { cpus: 64, gpus: 8 }, 0);
        let limit = spec.time_limit;
        Job::pending(id, spec, shape, limit, 0)
    }
}

impl NodeRegistration {
    pub fn test(name: &str, cpus: u32, mem_mb: u64, gpus: u32) -> NodeRegistration {
        NodeRegistration {
            name: name.into(),
            total: Tres::new(cpus, mem_mb, gpus),
            ..Default::default()
        }
    }
    pub fn features(mut self, f: &[&str]) -> Self {
        self.features = f.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn gpu_type(mut self, t: &str) -> Self {
        self.gpu_type = Some(t.into());
        self
    }
    pub fn partitions(mut self, p: &[&str]) -> Self {
        self.partitions = p.iter().map(|s| s.to_string()).collect();
        self
    }
}

impl State {
    /// A default-config cluster of `n` registered nodes `node-01..`, each with the given
    /// resources. Panics on bad input: for tests and benches.
    pub fn test_cluster(n: u32, cpus: u32, mem_mb: u64, gpus: u32) -> State {
        Self::test_cluster_with(ClusterConfig::default(), n, cpus, mem_mb, gpus)
    }

    pub fn test_cluster_with(
        config: ClusterConfig,
        n: u32,
        cpus: u32,
        mem_mb: u64,
        gpus: u32,
    ) -> State {
        let mut st = State::new(config).expect("test config");
        let width = if n >= 100 { 3 } else { 2 };
        for i in 1..=n {
            st.register_node(
                NodeRegistration::test(&format!("node-{i:0width$}"), cpus, mem_mb, gpus),
                0,
            )
            .expect("test node");
        }
        st.take_changes();
        st
    }
}
