//! CEL rules (`x-kubernetes-validations`) for what the schema alone cannot say: rules across
//! list items. Each rule has a Rust twin in [`crate::validate`] (tested there), because not
//! every API server evaluates CEL (the e2e harness does not) and the operator must refuse a
//! bad spec either way.
//!
//! List sizes are bounded in the schema so the rules' estimated cost stays under the API
//! server's per-expression limit (an `all(.. exists(..))` over n items costs about n²).

use schemars::Schema;
use serde_json::{Value, json};

fn rule(rule: &str, message: &str, field_path: &str) -> Value {
    json!({ "rule": rule, "message": message, "fieldPath": field_path })
}

fn add(schema: &mut Schema, rules: Vec<Value>) {
    schema.insert("x-kubernetes-validations".to_owned(), Value::Array(rules));
}

/// Rules on `TandemCluster.spec`.
pub fn cluster_rules(schema: &mut Schema) {
    add(
        schema,
        vec![
            rule(
                "!has(self.accounts) || self.accounts.all(a, !has(a.parent) || a.parent == '' || a.parent == 'root' || self.accounts.exists(b, b.name == a.parent))",
                "every account's parent must be root or an account declared in spec.accounts",
                ".accounts",
            ),
            rule(
                "!has(self.accounts) || self.accounts.all(a, self.accounts.exists_one(b, b.name == a.name))",
                "account names must be unique",
                ".accounts",
            ),
            rule(
                "!has(self.partitions) || self.partitions.all(p, self.partitions.exists_one(q, q.name == p.name))",
                "partition names must be unique",
                ".partitions",
            ),
            rule(
                "!has(self.partitions) || self.partitions.filter(p, has(p.default) && p.default).size() <= 1",
                "at most one partition may be the default",
                ".partitions",
            ),
            rule(
                "!has(self.qos) || self.qos.all(q, self.qos.exists_one(r, r.name == q.name))",
                "QOS names must be unique",
                ".qos",
            ),
            rule(
                "!has(self.bridge) || !has(self.bridge.namespaces) || self.bridge.namespaces.all(n, has(self.accounts) && self.accounts.exists(a, a.name == n.account))",
                "every bridge namespace must map to an account declared in spec.accounts",
                ".bridge.namespaces",
            ),
        ],
    );
}

/// Rules on `WorkerSet.spec`.
pub fn workerset_rules(schema: &mut Schema) {
    add(
        schema,
        vec![rule(
            "self.partitions.all(p, self.partitions.exists_one(q, q == p))",
            "partitions must not repeat",
            ".partitions",
        )],
    );
}
