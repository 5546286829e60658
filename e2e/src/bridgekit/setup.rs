//! What a bridge test asks [`super::BridgeEnv::start`] for: nodes, namespaces and their
//! bridge map entries, CRDs, controller flags. Apart from the environment because it is a
//! plain description, built before anything runs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

/// One batch node (and the harness node of the same name).
#[derive(Debug, Clone)]
pub struct NodeShape {
    pub name: String,
    pub cpus: u32,
    pub mem_gib: u32,
    pub gpus: u32,
}

/// What [`BridgeEnv::start`](super::BridgeEnv::start) sets up.
pub struct Setup {
    pub nodes: Vec<NodeShape>,
    /// Namespaces to create (`{base}-{random}`) and their entries in the bridge namespace
    /// map: the JSON object minus `namespace` (`{"account": "a", "qos": "low"}`).
    pub namespaces: Vec<(String, serde_json::Value)>,
    /// The CRDs to install (`tandem_operator::crd::all()`; the operator is a dev-dependency
    /// of the tests, not of this library).
    pub crds: Vec<CustomResourceDefinition>,
    /// Extra `tandem controller` flags.
    pub controller_args: Vec<String>,
}

impl Setup {
    pub fn new(crds: Vec<CustomResourceDefinition>) -> Self {
        Self {
            nodes: Vec::new(),
            namespaces: Vec::new(),
            crds,
            controller_args: Vec::new(),
        }
    }

    /// Adds a node of `cpus` CPUs, `mem_gib` GiB and `gpus` GPUs.
    pub fn node(mut self, name: &str, cpus: u32, mem_gib: u32, gpus: u32) -> Self {
        self.nodes.push(NodeShape {
            name: name.to_owned(),
            cpus,
            mem_gib,
            gpus,
        });
        self
    }

    /// Adds a namespace mapped to `account` in the bridge map; `extra` adds fields
    /// (`{"qos": "low"}`), `json!({})` for none.
    pub fn namespace(mut self, base: &str, account: &str, extra: serde_json::Value) -> Self {
        let mut entry = json!({ "account": account });
        crate::testkit::merge_json(&mut entry, extra);
        self.namespaces.push((base.to_owned(), entry));
        self
    }

    pub fn controller_arg(mut self, arg: &str) -> Self {
        self.controller_args.push(arg.to_owned());
        self
    }
}
