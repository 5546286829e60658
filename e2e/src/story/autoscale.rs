//! The story plays the autoscaler: the harness has no HPA controller and no
//! prometheus-adapter, so the story does their part for the `HorizontalPodAutoscaler` the
//! `tandem-cluster` chart made: it reads the HPA's External metric from the controller's
//! `/metrics` (as the adapter would serve it), computes the replicas as the HPA does for an
//! `AverageValue` target, and writes them through the worker set's scale subresource.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kube::api::DynamicObject;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The HPA's own no-change band (`--horizontal-pod-autoscaler-tolerance`, 10%).
const TOLERANCE: f64 = 0.1;

/// What the HPA controller reads from one `autoscaling/v2` HPA with one External metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Hpa {
    /// `scaleTargetRef`: kind and name (in the HPA's namespace).
    pub target_kind: String,
    pub target_name: String,
    pub min: i64,
    pub max: i64,
    /// The External metric's name and `selector.matchLabels`.
    pub metric: String,
    pub labels: BTreeMap<String, String>,
    /// `target.averageValue`.
    pub average_value: f64,
}

impl Hpa {
    /// Reads `obj` (an `autoscaling/v2` HPA); why not, if it has no External `AverageValue`
    /// metric first or lacks a field.
    pub fn from_object(obj: &DynamicObject) -> Result<Self, String> {
        let spec = &obj.data["spec"];
        let s = |v: &serde_json::Value, what: &str| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("the HPA has no {what}"))
        };
        let ext = &spec["metrics"][0]["external"];
        if ext["target"]["type"] != "AverageValue" {
            return Err(format!(
                "the HPA's first metric is not External with an AverageValue target: {}",
                spec["metrics"]
            ));
        }
        let labels = ext["metric"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let average = s(&ext["target"]["averageValue"], "target.averageValue")?;
        Ok(Self {
            target_kind: s(&spec["scaleTargetRef"]["kind"], "scaleTargetRef.kind")?,
            target_name: s(&spec["scaleTargetRef"]["name"], "scaleTargetRef.name")?,
            // minReplicas defaults to 1 in autoscaling/v2.
            min: spec["minReplicas"].as_i64().unwrap_or(1),
            max: spec["maxReplicas"]
                .as_i64()
                .ok_or("the HPA has no maxReplicas")?,
            metric: s(&ext["metric"]["name"], "metric.name")?,
            labels,
            average_value: quantity(&average).filter(|v| *v > 0.0).ok_or_else(|| {
                format!("target.averageValue {average:?} is not a positive quantity")
            })?,
        })
    }

    /// The replicas the HPA controller sets for `value` with `current` replicas: unchanged
    /// within the tolerance, else `ceil(value / averageValue)`, within `[min, max]`.
    pub fn desired(&self, value: f64, current: i64) -> i64 {
        let wanted = if current > 0
            && (value / (self.average_value * current as f64) - 1.0).abs() <= TOLERANCE
        {
            current
        } else {
            // A gauge of nodes: small and non-negative, so the cast cannot truncate.
            (value / self.average_value).ceil().max(0.0) as i64
        };
        wanted.clamp(self.min, self.max)
    }

    /// The series the adapter would serve: `name{k="v",...}`, labels sorted.
    pub fn series(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        format!("{}{{{}}}", self.metric, labels.join(","))
    }
}

/// A Kubernetes quantity as a number: plain (`"1"`, `"0.5"`) or milli (`"500m"`).
fn quantity(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok().map(|v| v / 1000.0),
        None => q.parse().ok(),
    }
}

/// The value of the sample `metric` whose labels include every one of `labels`, in
/// Prometheus/OpenMetrics text.
pub fn sample(text: &str, metric: &str, labels: &BTreeMap<String, String>) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (name, rest) = series.split_once('{').unwrap_or((series, "}"));
        if name != metric {
            return None;
        }
        let have: BTreeMap<&str, &str> = rest
            .trim_end_matches('}')
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.trim(), v.trim().trim_matches('"')))
            })
            .collect();
        labels
            .iter()
            .all(|(k, v)| have.get(k.as_str()) == Some(&v.as_str()))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// `GET /metrics` at `addr` (the controller Service's `metrics` port: plain HTTP); the body.
pub async fn scrape(addr: SocketAddr) -> Result<String, String> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting {addr}: {e}"))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: tandem\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("writing to {addr}: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .await
            .map_err(|e| format!("reading from {addr}: {e}"))?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("not an HTTP response from {addr}"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!(
                "GET http://{addr}/metrics: {}",
                head.lines().next().unwrap_or("")
            ));
        }
        Ok(body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .map_err(|_| format!("GET http://{addr}/metrics timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hpa() -> Hpa {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "gpu"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet", "name": "gpu"},
                "minReplicas": 2, "maxReplicas": 4,
                "metrics": [{"type": "External", "external": {
                    "metric": {"name": "tandem_partition_jobs_nodes_pending",
                               "selector": {"matchLabels": {"partition": "gpu"}}},
                    "target": {"type": "AverageValue", "averageValue": "1"}}}]
            }
        }))
        .unwrap();
        Hpa::from_object(&obj).unwrap()
    }

    #[test]
    fn an_hpa_is_read_and_scales_as_the_controller_does() {
        let h = hpa();
        assert_eq!(
            (h.target_kind.as_str(), h.target_name.as_str()),
            ("WorkerSet", "gpu")
        );
        assert_eq!((h.min, h.max), (2, 4));
        assert_eq!(
            h.series(),
            "tandem_partition_jobs_nodes_pending{partition=\"gpu\"}"
        );
        // ceil(value / 1), within [2, 4].
        assert_eq!(h.desired(3.0, 2), 3);
        assert_eq!(h.desired(10.0, 2), 4);
        assert_eq!(h.desired(0.0, 3), 2);
        // Within 10% of the target per replica: no change.
        assert_eq!(h.desired(3.2, 3), 3);
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn an_hpa_without_an_external_average_value_metric_is_refused() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "gpu"},
            "spec": {"scaleTargetRef": {"kind": "WorkerSet", "name": "gpu"}, "maxReplicas": 4,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                         "target": {"type": "Utilization", "averageUtilization": 50}}}]}
        }))
        .unwrap();
        assert!(Hpa::from_object(&obj).unwrap_err().contains("AverageValue"));
    }

    #[test]
    fn a_sample_is_found_by_name_and_labels() {
        let text = "# TYPE tandem_partition_jobs_nodes_pending gauge\n\
                    tandem_partition_jobs_nodes_pending{partition=\"cpu\"} 1\n\
                    tandem_partition_jobs_nodes_pending{partition=\"gpu\"} 10\n\
                    tandem_nodes 4\n# EOF\n";
        let gpu = BTreeMap::from([("partition".to_owned(), "gpu".to_owned())]);
        assert_eq!(
            sample(text, "tandem_partition_jobs_nodes_pending", &gpu),
            Some(10.0)
        );
        assert_eq!(sample(text, "tandem_nodes", &BTreeMap::new()), Some(4.0));
        let none = BTreeMap::from([("partition".to_owned(), "x".to_owned())]);
        assert_eq!(
            sample(text, "tandem_partition_jobs_nodes_pending", &none),
            None
        );
    }
}
