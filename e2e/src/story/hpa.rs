//! Step 4b: the worker set scales on pending demand. The story plays the HPA controller (and
//! prometheus-adapter) for the HPA the `tandem-cluster` chart made, with the pieces in
//! [`super::autoscale`]: the External metric from the controller's `/metrics`, the replicas
//! set through the worker set's scale subresource.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;

use super::manifests::CLUSTER;
use super::print::{say, show};
use super::values::WORKER_SET;
use super::{Story, StoryError, autoscale, failed, kube_err};

impl Story<'_> {
    /// The story as the HPA controller (and prometheus-adapter) for the HPA the chart made:
    /// once the array `array` waits, the HPA's External metric, read from the controller's
    /// `/metrics`, sets the worker set's replicas through its scale subresource; then the
    /// new workers come up. The replicas before and after.
    pub(super) async fn autoscale(&self, array: &str) -> Result<(i64, i64), StoryError> {
        let hpas: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("autoscaling", "v2", "HorizontalPodAutoscaler"),
                "horizontalpodautoscalers",
            ),
        );
        let obj = hpas
            .get(WORKER_SET)
            .await
            .map_err(kube_err("read the HorizontalPodAutoscaler"))?;
        let hpa = autoscale::Hpa::from_object(&obj).map_err(|e| failed("the HPA", e))?;
        if hpa.target_kind != "WorkerSet" {
            return Err(failed(
                "the HPA",
                format!("scales a {}, not a WorkerSet", hpa.target_kind),
            ));
        }
        say(&format!(
            "the worker set scales on pending demand: the story plays the HPA {WORKER_SET} (and \
             prometheus-adapter): {} from the controller's /metrics, target averageValue {}, \
             WorkerSet {} within [{}, {}]",
            hpa.series(),
            hpa.average_value,
            hpa.target_name,
            hpa.min,
            hpa.max
        ));
        let addr = self.metrics_addr().await?;
        let sets = self.api("WorkerSet", "workersets");
        let queue = [
            "squeue",
            "-t",
            "PD",
            "-o",
            "%.10i %.20j %.9P %.8u %.2t %.6D %R",
        ];
        let (pending, value, current, desired) = self
            .poll(
                "the array to wait and the HPA to want more workers",
                || async {
                    self.alive()?;
                    let pending = self.login(&queue).await?;
                    let waits = pending.lines().any(|l| {
                        l.split_whitespace()
                            .next()
                            .is_some_and(|id| id == array || id.starts_with(&format!("{array}_")))
                    });
                    let text = match autoscale::scrape(addr).await {
                        Ok(t) => t,
                        Err(e) => return Ok(Err(e)),
                    };
                    let Some(value) = autoscale::sample(&text, &hpa.metric, &hpa.labels) else {
                        return Ok(Err(format!("no {} in /metrics", hpa.series())));
                    };
                    let current = i64::from(
                        sets.get_scale(&hpa.target_name)
                            .await
                            .map_err(kube_err("read the WorkerSet's scale"))?
                            .spec
                            .and_then(|s| s.replicas)
                            .unwrap_or(0),
                    );
                    let desired = hpa.desired(value, current);
                    Ok(if waits && desired > current {
                        Ok((pending, value, current, desired))
                    } else {
                        Err(format!(
                            "{} = {value}: {current} -> {desired} replicas; pending:\n{pending}",
                            hpa.series()
                        ))
                    })
                },
            )
            .await?;
        say(&format!("squeue -t PD (the array {array} waits)"));
        show(&pending);
        println!(
            "{} = {value}; the HPA: ceil({value} / {}) within [{}, {}] = {desired} replicas (now {current})",
            hpa.series(),
            hpa.average_value,
            hpa.min,
            hpa.max
        );
        say(&format!(
            "kubectl -n {} scale workerset {} --replicas={desired}   (the scale subresource, as the HPA does)",
            self.ns, hpa.target_name
        ));
        sets.patch_scale(
            &hpa.target_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": desired}})),
        )
        .await
        .map_err(kube_err("scale the WorkerSet"))?;
        let n = usize::try_from(desired).map_err(|_| failed("the HPA", "negative replicas"))?;
        self.wait_ready("WorkerSet", "workersets", &hpa.target_name, n)
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.ns));
        show(&self.pods_table(&self.ns).await?);
        Ok((current, desired))
    }

    /// The controller Service's `metrics` port at its cluster IP (reached from here as a
    /// pod would, through the harness's service proxy).
    async fn metrics_addr(&self) -> Result<std::net::SocketAddr, StoryError> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.ns);
        let name = format!("{CLUSTER}-controller");
        let svc = services
            .get(&name)
            .await
            .map_err(kube_err("read the controller Service"))?;
        let spec = svc.spec.unwrap_or_default();
        let ip = spec
            .cluster_ip
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .ok_or_else(|| failed(format!("Service {name}"), "no cluster IP"))?;
        let port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .and_then(|p| u16::try_from(p.port).ok())
            .ok_or_else(|| failed(format!("Service {name}"), "no port named metrics"))?;
        Ok(std::net::SocketAddr::new(ip, port))
    }
}
