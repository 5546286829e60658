"""Renders one chart with real Helm (helm-python-sdk) and prints what `helm install` would
apply, as one JSON object on stdout:

  {"objects": [...], "hooks": [...], "notes": "..."}

`objects` are the chart's CRDs (its crds/ folder) and its templates' objects without a
`helm.sh/hook` annotation, in Helm's install order (by kind, as Helm's `InstallOrder`);
`hooks` are the post-install hook objects, by `helm.sh/hook-weight` then install order. The
e2e story (e2e/src/story) applies them to the harness and deletes them in reverse.

Usage: render.py CHART_DIR RELEASE NAMESPACE VALUES_JSON
Run it with the venv `scripts/chart-tests --venv-only` makes (target/chart-venv).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import helm_python as helm
import yaml

# Helm's releaseutil.InstallOrder; kinds not listed (custom resources) go last.
INSTALL_ORDER = [
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
    "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
    "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
    "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
    "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
    "APIService", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
]


def rank(obj: dict[str, Any]) -> int:
    kind = obj.get("kind", "")
    return INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    chart, release, namespace, values = argv[1], argv[2], argv[3], json.loads(argv[4])
    with helm.Chart.load(chart) as loaded:
        out = loaded.render(values, name=release, namespace=namespace, is_install=True)
        crds = [yaml.safe_load(c["data"]) for c in loaded.crds]
    notes = ""
    objects: list[dict[str, Any]] = []
    hooks: list[tuple[int, dict[str, Any]]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            ann = (doc.get("metadata") or {}).get("annotations") or {}
            events = ann.get("helm.sh/hook", "")
            if not events:
                objects.append(doc)
            elif "post-install" in events.split(","):
                hooks.append((int(ann.get("helm.sh/hook-weight", "0")), doc))
    objects = crds + sorted(objects, key=rank)
    ordered_hooks = [h for _, h in sorted(hooks, key=lambda wh: (wh[0], rank(wh[1])))]
    json.dump({"objects": objects, "hooks": ordered_hooks, "notes": notes}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
