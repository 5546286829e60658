#!/usr/bin/env python3
"""Chart tests: render Tandem's four charts with real Helm (helm-python-sdk, Helm's own
library), lint them, and validate every object they render.

Run through `scripts/chart-tests` (it makes the virtual environment). Checks:

- `helm lint --strict` of each chart, with default values and every example values file
  (`examples/k8s/helm/<chart>*.yaml`, `charts/<chart>/ci/*.yaml`);
- every rendered object, and every object in `examples/k8s/*.yaml`, against Kubernetes'
  schemas by `kubernetes-validate --strict` for the three newest minors it knows; Tandem's
  own kinds against the openAPIV3Schema of `charts/tandem-crds/crds/*.yaml`, unknown fields
  refused; the Job templates inside JobSets against batch/v1 Job. Kinds of other projects'
  CRDs (KEDA, cert-manager, prometheus-operator, JobSet, PodGroup) have no schema here:
  each such object is listed as NOT SCHEMA-CHECKED, never passed over in silence, and any
  other kind without a schema fails;
- pods of the charts pass PodSecurity `restricted`; names that objects share (RBAC
  subjects, Services and webhooks, scale targets) point at objects the chart renders;
- bad values (a negative replica count, an unknown field, a bad enum) are refused by
  `values.schema.json` with the field named in the error.

It writes the commands the rendered containers run to `$CHART_TESTS_OUT/entrypoints.json`
(default `target/chart-tests/`); `e2e/tests/packaging.rs` checks them against the binaries.
Prints one PASS/FAIL line per check and exits non-zero on any failure.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ["tandem-crds", "tandem-operator", "tandem-bridge", "tandem-cluster"]
NAMESPACE = "tandem"
# Kinds of other projects' CRDs: no schema ships with kubernetes-validate or this repo.
THIRD_PARTY = {
    ("keda.sh", "ScaledObject"),
    ("keda.sh", "TriggerAuthentication"),
    ("cert-manager.io", "Issuer"),
    ("cert-manager.io", "Certificate"),
    ("monitoring.coreos.com", "ServiceMonitor"),
    ("jobset.x-k8s.io", "JobSet"),
    ("scheduling.x-k8s.io", "PodGroup"),
}

results = {"pass": 0, "fail": 0}
not_schema_checked: list[str] = []


def check(name: str, fn: Callable[[], Any]) -> Any:
    """Runs one check; prints PASS or FAIL with the reason. Returns fn's value or None."""
    try:
        value = fn()
    except Exception as e:  # any failure of a check is that check's FAIL
        results["fail"] += 1
        msg = str(e).strip() or type(e).__name__
        if not isinstance(e, (AssertionError, helm.HelmError, jsonschema.ValidationError)):
            msg += "\n" + traceback.format_exc()
        print(f"FAIL {name}: {msg}", flush=True)
        return None
    results["pass"] += 1
    print(f"PASS {name}", flush=True)
    return value


def kube_versions() -> list[str]:
    """The three newest Kubernetes minors kubernetes-validate knows (newest first)."""
    minors = sorted(
        {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()},
        key=Version,
    )
    return [f"{m}.0" for m in minors[-3:]][::-1]


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def strict_schema(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields, as the API server's pruning would drop
    them silently: every object with properties and no additionalProperties gets
    `additionalProperties: false` (x-kubernetes-preserve-unknown-fields objects stay open)."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


def load_crd_schemas() -> dict[tuple[str, str, str], Any]:
    schemas = {}
    for path in sorted(glob.glob(str(ROOT / "charts/tandem-crds/crds/*.yaml"))):
        crd = yaml.safe_load(Path(path).read_text())
        spec = crd["spec"]
        for v in spec["versions"]:
            s = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            # apiVersion, kind and metadata are the API server's to check.
            s.setdefault("properties", {})
            for k in ("apiVersion", "kind"):
                s["properties"][k] = {"type": "string"}
            s["properties"]["metadata"] = {"type": "object"}
            schemas[(spec["group"], v["name"], spec["names"]["kind"])] = strict_schema(s)
    return schemas


CRD_SCHEMAS: dict[tuple[str, str, str], Any] = {}
VERSIONS: list[str] = []


def validate_object(obj: dict[str, Any], where: str) -> None:
    """Validates one object; raises AssertionError naming what is wrong."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    assert api_version and kind, f"{where}: an object without apiVersion/kind"
    name = obj.get("metadata", {}).get("name", "?")
    group = group_of(api_version)
    if group == "tandem.dev":
        version = api_version.split("/")[1]
        schema = CRD_SCHEMAS.get((group, version, kind))
        assert schema is not None, f"{where}: {kind} {api_version} is not in charts/tandem-crds"
        errors = sorted(
            jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path)
        )
        assert not errors, f"{where}: {kind}/{name}: " + "; ".join(
            f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors
        )
        return
    if (group, kind) in THIRD_PARTY:
        not_schema_checked.append(f"{kind}/{name} ({api_version}) in {where}")
        if kind == "JobSet":
            # The Jobs inside are plain batch/v1 Jobs: those can be checked.
            for rj in obj.get("spec", {}).get("replicatedJobs", []):
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": f"{name}-{rj.get('name')}"},
                    **rj.get("template", {}),
                }
                validate_object(job, f"{where} (JobSet {name} replicatedJob {rj.get('name')})")
        return
    for v in VERSIONS:
        try:
            kubernetes_validate.validate(obj, v, strict=True)
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            raise AssertionError(f"{where}: {kind}/{name}: {e.message}; no schema to check it")
        except kubernetes_validate.utils.ValidationError as e:
            path = ".".join(map(str, e.path)) or "<root>"
            raise AssertionError(f"{where}: {kind}/{name} on Kubernetes {v}: {path}: {e.message}")


def parse_manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    objs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objs.append(doc)
    return objs


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            out.append((f"{kind}/{name}", o["spec"]["template"]["spec"]))
    return out


def assert_restricted(where: str, spec: dict[str, Any]) -> None:
    """PodSecurity `restricted`: non-root, RuntimeDefault seccomp, no privilege escalation,
    every capability dropped; and Tandem's own bar: a read-only root filesystem."""
    psc = spec.get("securityContext", {})
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        cname = f"{where} container {c['name']}"
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{cname}: runAsNonRoot"
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
        assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), f"{cname}: seccompProfile"
        assert sc.get("allowPrivilegeEscalation") is False, f"{cname}: allowPrivilegeEscalation"
        assert "ALL" in sc.get("capabilities", {}).get("drop", []), f"{cname}: drop ALL"
        assert sc.get("readOnlyRootFilesystem") is True, f"{cname}: readOnlyRootFilesystem"


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def names(objs: list[dict[str, Any]], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in by_kind(objs, kind)}


def check_references(chart: str, objs: list[dict[str, Any]], values: dict[str, Any]) -> None:
    """Names objects share point at objects the chart renders (or made outside it, by the
    operator, where stated)."""
    sas = names(objs, "ServiceAccount")
    for spec_where, spec in pod_specs(objs):
        sa = spec.get("serviceAccountName")
        if values.get("serviceAccount", {}).get("create", True) or "webhook-certs" in spec_where:
            assert sa in sas, f"{spec_where} runs as {sa}, not rendered ({sorted(sas)})"
    roles = {("ClusterRole", n) for n in names(objs, "ClusterRole")} | {
        ("Role", n) for n in names(objs, "Role")
    }
    for b in by_kind(objs, "ClusterRoleBinding") + by_kind(objs, "RoleBinding"):
        ref = (b["roleRef"]["kind"], b["roleRef"]["name"])
        assert ref in roles, f"{b['kind']}/{b['metadata']['name']} binds missing {ref}"
        for s in b["subjects"]:
            assert s["name"] in sas, f"{b['kind']}/{b['metadata']['name']} subject {s['name']}"
    if chart == "tandem-operator" and values.get("rbac", {}).get("create", True):
        # files/rbac.yaml is the operator's own table of API calls, by scope (operator/src/
        # rbac.rs); e2e/tests/packaging.rs compares the granted verbs with that table.
        generated = yaml.safe_load((ROOT / "charts/tandem-operator/files/rbac.yaml").read_text())
        (role,) = by_kind(objs, "ClusterRole")
        watched = values.get("watchNamespace", "")
        if watched:
            assert role["rules"] == generated["clusterRules"], "the ClusterRole grants more than Nodes"
            (nsrole,) = by_kind(objs, "Role")
            assert nsrole["metadata"]["namespace"] == watched, "the Role is not in the watched namespace"
            assert nsrole["rules"] == generated["namespacedRules"], "Role differs from files/rbac.yaml"
            (rb,) = by_kind(objs, "RoleBinding")
            assert rb["metadata"]["namespace"] == watched
            assert all(s["namespace"] == NAMESPACE for s in rb["subjects"]), rb["subjects"]
        else:
            want = generated["clusterRules"] + generated["namespacedRules"]
            assert role["rules"] == want, "operator ClusterRole differs from files/rbac.yaml"
            assert not by_kind(objs, "Role"), "a Role when watching every namespace"
    if chart == "tandem-bridge":
        (dep,) = by_kind(objs, "Deployment")
        container = dep["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        assert dep["spec"]["replicas"] == values.get("replicas", 2)
        elect = values.get("leaderElection", {}).get("enabled", True)
        want = "--leader-elect=true" if elect else "--leader-elect=false"
        assert want in args, f"leaderElection.enabled={elect} but args are {args}"
        lease_role = any(
            r for o in by_kind(objs, "Role") for r in o["rules"] if "leases" in r["resources"]
        )
        assert lease_role == (elect and values.get("rbac", {}).get("create", True)), "Lease Role"
        if values.get("rbac", {}).get("create", True):
            rules = [r for o in by_kind(objs, "ClusterRole") for r in o["rules"]]
            def granted(group: str, resource: str, verb: str) -> bool:
                return any(
                    group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
                    for r in rules
                )
            for group, resource, verb in [
                ("", "pods", "watch"), ("", "pods/binding", "create"), ("", "pods/eviction", "create"),
                ("", "pods/status", "patch"), ("", "nodes", "patch"), ("events.k8s.io", "events", "create"),
                ("tandem.dev", "tandemclusters", "watch"), ("scheduling.x-k8s.io", "podgroups", "get"),
                ("jobset.x-k8s.io", "jobsets", "get"), ("batch", "jobs", "get"),
                ("scheduling.k8s.io", "workloads", "get"),
            ]:
                assert granted(group, resource, verb), f"bridge ClusterRole lacks {verb} {group}/{resource}"
        hooks = [o for o in by_kind(objs, "Job") if "webhook-certs" in o["metadata"]["name"]]
        configs = by_kind(objs, "MutatingWebhookConfiguration")
        if values.get("webhook", {}).get("enabled", True):
            (svc,) = by_kind(objs, "Service")
            (cfg,) = configs
            port_names = {p["name"] for p in container.get("ports", [])}
            assert svc["spec"]["ports"][0]["port"] == 443
            assert svc["spec"]["ports"][0]["targetPort"] in port_names, "webhook Service targets no port"
            hook = cfg["webhooks"][0]
            assert hook["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
            assert hook["namespaceSelector"]["matchExpressions"], "webhook without namespaceSelector"
            assert "UPDATE" in hook["rules"][0]["operations"], "account edits are not checked"
            guards = by_kind(objs, "ValidatingWebhookConfiguration")
            if values.get("webhook", {}).get("guard", {}).get("enabled", True):
                (gcfg,) = guards
                (guard,) = gcfg["webhooks"]
                assert guard["clientConfig"]["service"]["path"] == "/guard"
                assert guard["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
                assert any("pods/binding" in r["resources"] for r in guard["rules"]), "bindings unguarded"
                assert guard["matchConditions"], "the guard is called for every pod"
            else:
                assert not guards, "guard disabled but rendered"
            tls_secret = next(
                v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"]
                if v["name"] == "webhook-tls"
            )
            mode = values.get("webhook", {}).get("tls", {}).get("mode", "self-signed")
            if mode == "cert-manager":
                assert not hooks, "cert-manager mode still renders the hook Job"
                (cert,) = by_kind(objs, "Certificate")
                inject = cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                assert inject == f"{NAMESPACE}/{cert['metadata']['name']}", inject
                assert cert["spec"]["secretName"] == tls_secret
                assert cert["spec"]["issuerRef"]["name"] in names(objs, "Issuer")
            else:
                (job,) = hooks
                jargs = job["spec"]["template"]["spec"]["containers"][0]["args"]
                flag = lambda f: jargs[jargs.index(f) + 1]
                assert jargs[0] == "webhook-certs"
                assert flag("--secret") == tls_secret
                assert flag("--service") == svc["metadata"]["name"]
                assert flag("--mutating-webhook") == cfg["metadata"]["name"]
                if guards:
                    assert flag("--validating-webhook") == guards[0]["metadata"]["name"]
                assert flag("--namespace") == NAMESPACE
                assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
        else:
            assert not configs and not hooks, "webhook disabled but rendered"
    if chart == "tandem-cluster":
        (tc,) = by_kind(objs, "TandemCluster")
        sets = names(objs, "WorkerSet")
        for ws in by_kind(objs, "WorkerSet") + by_kind(objs, "LoginSet"):
            assert ws["spec"]["clusterName"] == tc["metadata"]["name"]
        for o in by_kind(objs, "HorizontalPodAutoscaler") + by_kind(objs, "ScaledObject"):
            ref = o["spec"]["scaleTargetRef"]
            assert ref["kind"] == "WorkerSet" and ref["name"] in sets, f"{o['kind']} targets {ref}"
        for so in by_kind(objs, "ScaledObject"):
            md = so["spec"]["triggers"][0]["metadata"]
            assert md["scalerAddress"].startswith(f"{tc['metadata']['name']}-controller."), md
            assert all(isinstance(v, str) for v in md.values()), f"KEDA metadata must be strings: {md}"
        accounts = {a["name"] for a in tc["spec"].get("accounts", [])}
        for m in tc["spec"].get("bridge", {}).get("namespaces", []):
            assert m["account"] in accounts, f"bridge maps {m['namespace']} to undeclared {m['account']}"
        partitions = {p["name"] for p in tc["spec"]["partitions"]}
        for ws in by_kind(objs, "WorkerSet"):
            assert set(ws["spec"]["partitions"]) <= partitions, f"{ws['metadata']['name']} partitions"


def values_files(chart: str) -> list[Path]:
    files = sorted((ROOT / "examples/k8s/helm").glob(f"{chart}*.yaml"))
    files += sorted((ROOT / "charts" / chart / "ci").glob("*.yaml"))
    return files


# (values, words the error must name) that values.schema.json must refuse.
BAD_VALUES: dict[str, list[tuple[dict[str, Any], list[str]]]] = {
    "tandem-crds": [({"replicas": 1}, ["replicas"])],
    "tandem-operator": [
        ({"replicas": -1}, ["replicas"]),
        ({"watchNamespaces": ["a"]}, ["watchNamespaces"]),
        ({"rbac": {"create": True, "extra": 1}}, ["extra"]),
        ({"image": {"pullPolicy": "Sometimes"}}, ["pullPolicy"]),
    ],
    "tandem-bridge": [
        ({"replicas": -1}, ["replicas"]),
        ({"webhook": {"tls": {"mode": "letsencrypt"}}}, ["mode"]),
        ({"webhook": {"namespaceSelecter": {}}}, ["namespaceSelecter"]),
        ({"cluster": {"name": "Research_1"}}, ["name"]),
        ({"nodeGraceSeconds": -5}, ["nodeGraceSeconds"]),
    ],
    "tandem-cluster": [
        ({"workerSets": [{"name": "gpu", "replicas": -1, "partitions": ["gpu"]}]}, ["replicas"]),
        ({"workerSets": [{"name": "gpu", "replicas": 1, "partitions": ["gpu"], "replica": 2}]}, ["replica"]),
        ({"login": {"replicas": -2}}, ["replicas"]),
        ({"loginSet": {}}, ["loginSet"]),
        ({"workerSets": [{"name": "gpu", "replicas": 0, "partitions": ["gpu"],
                          "autoscaling": {"keda": {"minReplicaCount": -1}}}]}, ["minReplicaCount"]),
    ],
}


def main() -> int:
    global VERSIONS
    VERSIONS = kube_versions()
    CRD_SCHEMAS.update(load_crd_schemas())
    print(f"helm library {helm.helm_sdk_version()}, kubernetes-validate "
          f"{kubernetes_validate.__version__}, Kubernetes {', '.join(VERSIONS)}")
    entrypoints: list[dict[str, Any]] = []

    for chart in CHARTS:
        path = ROOT / "charts" / chart
        with helm.Chart.load(path) as loaded:
            meta = loaded.metadata
            def metadata() -> None:
                assert meta.get("appVersion"), "Chart.yaml has no appVersion"
                assert loaded.schema, "no values.schema.json"
            check(f"{chart}: Chart.yaml has appVersion and a values.schema.json", metadata)
            variants: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
            for f in values_files(chart):
                variants.append((str(f.relative_to(ROOT)), helm.values_from_yaml(f.read_text()) or {}))
            for label, values in variants:
                def lint() -> None:
                    report = helm.lint(path, values, strict=True, namespace=NAMESPACE)
                    bad = [m for m in report["messages"] if m["severity"] >= 2]
                    assert not report["errors"] and not bad, json.dumps(report["errors"] + bad)
                check(f"{chart} [{label}]: helm lint --strict", lint)

                def render() -> list[dict[str, Any]]:
                    out = loaded.render(values, name=chart if chart != "tandem-cluster" else "research",
                                        namespace=NAMESPACE, is_install=True)
                    notes = next((t for p, t in out.items() if p.endswith("NOTES.txt")), "")
                    assert "kubectl" in notes or "helm install" in notes, "NOTES.txt tells no next command"
                    objs = parse_manifests(out)
                    if chart == "tandem-crds":
                        objs += [yaml.safe_load(c["data"]) for c in loaded.crds]
                    assert objs, "renders nothing"
                    return objs
                objs = check(f"{chart} [{label}]: renders with NOTES.txt naming the next command", render)
                if objs is None:
                    continue
                for o in objs:
                    kind, name = o.get("kind"), o.get("metadata", {}).get("name")
                    check(f"{chart} [{label}]: {kind}/{name} validates",
                          lambda o=o: validate_object(o, f"{chart} [{label}]"))
                for where, spec in pod_specs(objs):
                    check(f"{chart} [{label}]: {where} passes PodSecurity restricted",
                          lambda spec=spec, where=where: assert_restricted(where, spec))
                    for c in spec["containers"]:
                        entrypoints.append({"where": f"{chart} [{label}] {where}",
                                            "command": c.get("command", []), "args": c.get("args", [])})
                check(f"{chart} [{label}]: names shared between objects resolve",
                      lambda: check_references(chart, objs, values))

            check(f"{chart}: default values pass values.schema.json",
                  lambda: loaded.validate_schema(loaded.values))
            for bad, words in BAD_VALUES[chart]:
                def refused(bad: dict[str, Any] = bad, words: list[str] = words) -> None:
                    try:
                        loaded.validate_schema(loaded.merge_values(bad))
                    except helm.HelmValuesError as e:
                        msg = str(e)
                        missing = [w for w in words if w not in msg]
                        assert not missing, f"the error does not name {missing}: {msg}"
                    else:
                        raise AssertionError(f"values {bad} accepted")
                    # And an install with them renders nothing.
                    try:
                        loaded.render(bad, name="bad", namespace=NAMESPACE, is_install=True)
                    except helm.HelmError:
                        return
                    raise AssertionError(f"render accepted {bad}")
                check(f"{chart}: values.schema.json refuses {json.dumps(bad)} naming {words}", refused)

    with helm.Chart.load(ROOT / "charts/tandem-cluster") as cluster:
        def both_autoscalers() -> None:
            ws = {"name": "gpu", "replicas": 1, "partitions": ["gpu"],
                  "autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}}
            try:
                cluster.render({"workerSets": [ws]}, name="research", namespace=NAMESPACE)
            except helm.HelmRenderError as e:
                assert "not both" in str(e), str(e)
                return
            raise AssertionError("HPA and KEDA on one worker set rendered")
        check("tandem-cluster: HPA and KEDA on one worker set are refused", both_autoscalers)

        # A worker set is a list entry, so values.yaml's autoscaler defaults do not reach
        # it: the template fills what has a safe default and refuses a missing maximum.
        def hpa_without_max() -> None:
            ws = {"name": "gpu", "replicas": 1, "partitions": ["gpu"],
                  "autoscaling": {"hpa": {"enabled": True}}}
            try:
                cluster.render({"workerSets": [ws]}, name="research", namespace=NAMESPACE)
            except helm.HelmRenderError as e:
                assert "hpa.maxReplicas is required" in str(e), str(e)
                return
            raise AssertionError("an HPA without maxReplicas rendered")
        check("tandem-cluster: an HPA without maxReplicas is refused, naming it", hpa_without_max)

        def hpa_min_defaults() -> None:
            ws = {"name": "gpu", "replicas": 1, "partitions": ["gpu"],
                  "autoscaling": {"hpa": {"enabled": True, "maxReplicas": 4}}}
            objs = parse_manifests(cluster.render({"workerSets": [ws]}, name="research",
                                                  namespace=NAMESPACE))
            hpa = by_kind(objs, "HorizontalPodAutoscaler")
            assert len(hpa) == 1, hpa
            assert hpa[0]["spec"]["minReplicas"] == 1, hpa[0]["spec"]
            assert hpa[0]["spec"]["maxReplicas"] == 4, hpa[0]["spec"]
            for o in objs:
                validate_object(o, "hpa defaults")
        check("tandem-cluster: an HPA given only maxReplicas gets minReplicas 1", hpa_min_defaults)

    for f in sorted((ROOT / "examples/k8s").glob("*.yaml")):
        rel = str(f.relative_to(ROOT))
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        def has_objects(docs: list[Any] = docs) -> None:
            assert docs, "no objects"
        check(f"{rel}: has objects", has_objects)
        for d in docs:
            check(f"{rel}: {d.get('kind')}/{d.get('metadata', {}).get('name')} validates",
                  lambda d=d, rel=rel: validate_object(d, rel))

    out_dir = Path(os.environ.get("CHART_TESTS_OUT", ROOT / "target/chart-tests"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "entrypoints.json").write_text(json.dumps(entrypoints, indent=1))

    for line in sorted(set(not_schema_checked)):
        print(f"NOT SCHEMA-CHECKED (third-party CRD, no schema available): {line}")
    print(f"charts: {results['pass']} passed, {results['fail']} failed")
    return 1 if results["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
