//! Steps 3 and 5: the serving team's inference Deployment (`schedulerName: tandem`), bound
//! by the bridge to pool nodes that turn to `kube` mode; then scaled to zero, and a job on
//! every node turns them `batch` again.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::manifests::{self, RESEARCH};
use super::print::{say, show};
use super::{POOL, Story, StoryError, kit_err, kube_err};
use crate::testkit::{create_all, objects_from_yaml};

impl Story<'_> {
    /// Step 3: the inference Deployment up on pool nodes in `kube` mode; those nodes.
    pub(super) async fn serve(&mut self) -> Result<Vec<String>, StoryError> {
        say(&format!(
            "the serving team: kubectl -n {} apply -f inference.yaml (2 x 1 GPU, schedulerName: tandem)",
            self.serving
        ));
        let objs = objects_from_yaml(&manifests::inference(2))
            .map_err(kit_err("the inference Deployment"))?;
        create_all(&self.client, &self.serving, &objs)
            .await
            .map_err(kit_err("creating the inference Deployment"))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.serving);
        let nodes = self
            .poll("2 inference pods Running on pool nodes", || async {
                self.alive()?;
                let list = pods
                    .list(&ListParams::default().labels("app=infer"))
                    .await
                    .map_err(kube_err("list inference pods"))?
                    .items;
                let running: Vec<String> = list
                    .iter()
                    .filter(|p| crate::testkit::phase(p) == "Running")
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .collect();
                Ok((running.len() == 2)
                    .then(|| running.clone())
                    .ok_or(format!("running on {running:?} of {} pods", list.len())))
            })
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.serving));
        show(&self.pods_table(&self.serving).await?);
        say("sinfo -N -o '%N %t %k' (the serving nodes are in kube mode)");
        let sinfo = self
            .poll_login(&["sinfo", "-N", "-h", "-o", "%N %t %k"], "kube mode", |o| {
                nodes.iter().all(|n| mode(o, n) == Some("kube"))
            })
            .await?;
        show(&sinfo);
        let mut distinct = nodes.clone();
        distinct.sort();
        distinct.dedup();
        Ok(distinct)
    }

    /// Step 5: the Deployment scaled to zero and a job on every node; `kube_nodes` back in
    /// `batch` mode.
    pub(super) async fn flip(&mut self, kube_nodes: &[String]) -> Result<Vec<String>, StoryError> {
        say(&format!(
            "the serving team scales to zero: kubectl -n {} scale deployment infer --replicas=0",
            self.serving
        ));
        let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.serving);
        deploys
            .patch(
                "infer",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map_err(kube_err("scale the Deployment"))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.serving);
        self.poll("the inference pods to go", || async {
            let n = pods
                .list(&ListParams::default().labels("app=infer"))
                .await
                .map_err(kube_err("list inference pods"))?
                .items
                .len();
            Ok((n == 0).then_some(()).ok_or(format!("{n} pods")))
        })
        .await?;
        say(&format!(
            "sbatch -N {} --wrap hostname: a job on every node; the kube nodes turn batch",
            POOL.nodes
        ));
        let n = POOL.nodes.to_string();
        let id = self
            .sbatch(&[
                "-A",
                RESEARCH,
                "-N",
                &n,
                "-o",
                "/dev/null",
                "--wrap",
                "hostname",
            ])
            .await?;
        self.poll_login(
            &["sacct", "-j", &id, "-X", "-n", "-o", "State"],
            "COMPLETED",
            |o| o.trim() == "COMPLETED",
        )
        .await?;
        let sinfo = self
            .poll_login(
                &["sinfo", "-N", "-h", "-o", "%N %t %k"],
                "batch mode",
                |o| kube_nodes.iter().all(|n| mode(o, n) == Some("batch")),
            )
            .await?;
        say("sinfo -N -o '%N %t %k'");
        show(&sinfo);
        Ok(kube_nodes.to_vec())
    }
}

/// A node's mode in `sinfo -N -h -o '%N %t %k'` output.
fn mode<'s>(sinfo: &'s str, node: &str) -> Option<&'s str> {
    sinfo.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&node))
            .then(|| w.get(2).copied())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_read_per_node_from_sinfo() {
        let s = "gpu-0 mix kube\ngpu-1 idle batch\n";
        assert_eq!(mode(s, "gpu-0"), Some("kube"));
        assert_eq!(mode(s, "gpu-1"), Some("batch"));
        assert_eq!(mode(s, "gpu-2"), None);
    }
}
