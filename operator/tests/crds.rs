//! The CRDs checked in for the charts are exactly what the Rust types generate.

use std::path::PathBuf;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/tandem-crds/crds")
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = crd_dir();
    let mut stale = Vec::new();
    let mut expected_files = Vec::new();
    for crd in tandem_operator::crd::all() {
        let name = tandem_operator::crd::file_name(&crd);
        let want = tandem_operator::crd::to_yaml(&crd).expect("CRD serializes");
        let path = dir.join(&name);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            stale.push(name.clone());
        }
        expected_files.push(name);
    }
    assert!(
        stale.is_empty(),
        "stale CRDs in {}: {stale:?}; regenerate with `cargo run -p tandem-operator -- crds --out-dir charts/tandem-crds/crds`",
        dir.display()
    );
    // No leftover file for a CRD that no longer exists.
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("crds dir exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(
        present,
        expected_files,
        "unexpected files in {}",
        dir.display()
    );
}

#[test]
fn crds_name_the_contract() {
    let crds = tandem_operator::crd::all();
    let by_kind = |k: &str| {
        crds.iter()
            .find(|c| c.spec.names.kind == k)
            .unwrap_or_else(|| panic!("{k} CRD"))
    };
    for (kind, short) in [
        ("TandemCluster", "tc"),
        ("WorkerSet", "ws"),
        ("LoginSet", "lgs"),
    ] {
        let c = by_kind(kind);
        assert_eq!(c.spec.group, "tandem.dev");
        assert_eq!(c.spec.versions[0].name, "v1alpha1");
        assert_eq!(
            c.spec.names.short_names.as_deref(),
            Some(&[short.to_owned()][..])
        );
    }
    let ws = by_kind("WorkerSet");
    let v = &ws.spec.versions[0];
    let scale = v
        .subresources
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .expect("WorkerSet has the scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let cols: Vec<&str> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    for want in [
        "DESIRED",
        "READY",
        "IDLE",
        "ALLOCATED",
        "KUBE",
        "DOWN",
        "DRAIN",
    ] {
        assert!(
            cols.contains(&want),
            "WorkerSet printer columns {cols:?} lack {want}"
        );
    }
    let json = serde_json::to_value(v.schema.as_ref().expect("schema")).expect("json");
    let replicas = &json["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"];
    assert_eq!(replicas["minimum"], serde_json::json!(0.0), "{replicas}");
    let tc = serde_json::to_value(by_kind("TandemCluster")).expect("json");
    let text = tc.to_string();
    assert!(text.contains("x-kubernetes-validations"));
    let shares = &tc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["accounts"]["items"]["properties"]["shares"];
    assert_eq!(shares["type"], "integer", "{shares}");
}
