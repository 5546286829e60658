//! `kubectl get pods -o wide`, as the story prints it: pure, from the pods' objects.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The columns kubectl prints for `get pods -o wide` (less NOMINATED NODE and READINESS
/// GATES, which the story never sets), with AGE relative to `now`.
pub fn pods_wide(pods: &[Pod], now: Time) -> String {
    let mut rows = vec![
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "SCHEDULER",
        ]
        .map(str::to_owned),
    ];
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|p| p.metadata.name.clone());
    for p in sorted {
        let spec = p.spec.clone().unwrap_or_default();
        let status = p.status.clone().unwrap_or_default();
        let statuses = status.container_statuses.clone().unwrap_or_default();
        let ready = statuses.iter().filter(|c| c.ready).count();
        let restarts: i32 = statuses.iter().map(|c| c.restart_count).sum();
        let age = p.metadata.creation_timestamp.as_ref().map_or_else(
            || "<unknown>".to_owned(),
            |t| age(now.0.duration_since(t.0)),
        );
        rows.push([
            p.metadata.name.clone().unwrap_or_default(),
            format!("{ready}/{}", spec.containers.len()),
            pod_status(p),
            restarts.to_string(),
            age,
            status.pod_ip.unwrap_or_else(|| "<none>".into()),
            spec.node_name.unwrap_or_else(|| "<none>".into()),
            spec.scheduler_name
                .unwrap_or_else(|| "default-scheduler".into()),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// kubectl's STATUS: a waiting or terminated container's reason, `Terminating` for a pod
/// being deleted, else the phase.
fn pod_status(p: &Pod) -> String {
    if p.metadata.deletion_timestamp.is_some() {
        return "Terminating".into();
    }
    let status = p.status.clone().unwrap_or_default();
    for c in status.container_statuses.iter().flatten() {
        let state = c.state.clone().unwrap_or_default();
        if let Some(w) = state.waiting.and_then(|w| w.reason) {
            return w;
        }
        if let Some(t) = state.terminated.and_then(|t| t.reason) {
            return t;
        }
    }
    status.phase.unwrap_or_else(|| "Pending".into())
}

/// kubectl's short age: `42s`, `3m5s`, `2h`.
fn age(d: k8s_openapi::jiff::SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 if s % 60 != 0 => format!("{}m{}s", s / 60, s % 60),
        120..7200 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn at(s: &str) -> Time {
        serde_json::from_value(json!(s)).unwrap()
    }

    #[test]
    fn columns_line_up_and_say_what_kubectl_says() {
        let pods = [
            pod(json!({
                "metadata": {"name": "infer-7d9-x2", "creationTimestamp": "2025-01-01T00:00:00Z"},
                "spec": {"schedulerName": "tandem", "nodeName": "gpu-1",
                         "containers": [{"name": "serve"}]},
                "status": {"phase": "Running", "podIP": "127.1.0.5",
                           "containerStatuses": [{"name": "serve", "ready": true, "restartCount": 1,
                               "image": "busybox", "imageID": "", "state": {"running": {}}}]},
            })),
            pod(json!({
                "metadata": {"name": "gpu-gpu-0", "creationTimestamp": "2025-01-01T00:00:50Z"},
                "spec": {"containers": [{"name": "worker"}, {"name": "side"}]},
                "status": {"phase": "Pending", "containerStatuses": [{"name": "worker",
                    "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                    "state": {"waiting": {"reason": "ContainerCreating"}}}]},
            })),
        ];
        let out = pods_wide(&pods, at("2025-01-01T00:03:00Z"));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("NAME "), "{out}");
        // Sorted by name; every column starts where its header does.
        assert!(lines[1].starts_with("gpu-gpu-0 "), "{out}");
        let node_col = lines[0].find("NODE").unwrap();
        assert_eq!(&lines[2][node_col..node_col + 5], "gpu-1", "{out}");
        assert_eq!(&lines[1][node_col..node_col + 6], "<none>", "{out}");
        let w: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            w,
            [
                "gpu-gpu-0",
                "0/2",
                "ContainerCreating",
                "0",
                "2m10s",
                "<none>",
                "<none>",
                "default-scheduler"
            ]
        );
        let w: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            w,
            [
                "infer-7d9-x2",
                "1/1",
                "Running",
                "1",
                "3m",
                "127.1.0.5",
                "gpu-1",
                "tandem"
            ]
        );
    }
}
