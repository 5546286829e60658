//! The end: the inference Deployment deleted, then `helm uninstall` of each release, last
//! installed first (every object it made deleted, last first), and the checks that nothing
//! is left, no pod either; on a real cluster the story's namespaces are deleted too.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};

use super::print::say;
use super::{Release, Story, StoryError, failed, helm, kube_err};

impl Story<'_> {
    /// The end: the serving team deletes its Deployment, then `helm uninstall
    /// tandem-cluster` (the operator, still running, drains and removes its pods), then the
    /// operator and the bridge stop and `helm uninstall tandem-bridge tandem-operator
    /// tandem-crds`. `check`: fail unless nothing is left, no pod either.
    pub(super) async fn cleanup(&mut self, check: bool) -> Result<(), StoryError> {
        if self.ns.is_empty() {
            return Ok(());
        }
        say(&format!(
            "the serving team: kubectl -n {} delete deployment infer",
            self.serving
        ));
        let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.serving);
        let _ = deploys.delete("infer", &DeleteParams::default()).await;
        let cluster = self.uninstall(&["tandem-cluster"], check).await;
        let pods = if check && cluster.is_ok() {
            let (ns, serving) = (self.ns.clone(), self.serving.clone());
            self.poll("every pod to go", || async {
                let mut left = Vec::new();
                for n in [&ns, &serving] {
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), n);
                    left.extend(
                        pods.list(&ListParams::default())
                            .await
                            .map_err(kube_err("list pods"))?
                            .items
                            .into_iter()
                            .filter_map(|p| p.metadata.name),
                    );
                }
                Ok(left
                    .is_empty()
                    .then_some(())
                    .ok_or(format!("left: {left:?}")))
            })
            .await
            .map(|()| println!("no pod left in {ns} or {serving}"))
        } else {
            Ok(())
        };
        self.bridge = None;
        self.operator = None;
        let rest = self
            .uninstall(&["tandem-bridge", "tandem-operator", "tandem-crds"], check)
            .await;
        cluster?;
        pods?;
        rest
    }

    /// `helm uninstall` of the releases `names` (those installed), in that order: each
    /// release's objects deleted last first. `check`: fail unless none of them is left.
    pub(super) async fn uninstall(
        &mut self,
        names: &[&str],
        check: bool,
    ) -> Result<(), StoryError> {
        let releases: Vec<&Release> = names
            .iter()
            .filter_map(|n| self.releases.iter().find(|r| r.name == *n))
            .collect();
        if releases.is_empty() {
            return Ok(());
        }
        let listed: Vec<&str> = releases.iter().map(|r| r.name.as_str()).collect();
        let listed = listed.join(" ");
        say(&format!(
            "helm uninstall {listed}: every object each made, last first"
        ));
        let mut failures = Vec::new();
        for r in &releases {
            failures.extend(helm::delete_all(&self.client, &r.made).await);
        }
        if !check {
            return Ok(());
        }
        if !failures.is_empty() {
            return Err(failed("helm uninstall", failures.join("; ")));
        }
        let made: Vec<helm::Made> = releases.iter().flat_map(|r| r.made.clone()).collect();
        self.poll(&format!("every object {listed} made to go"), || async {
            let mut left = Vec::new();
            for m in &made {
                if m.api(&self.client)
                    .get_opt(&m.name)
                    .await
                    .map_err(kube_err("read a release's object"))?
                    .is_some()
                {
                    left.push(m.describe());
                }
            }
            Ok(left
                .is_empty()
                .then_some(())
                .ok_or(format!("left: {left:?}")))
        })
        .await?;
        let crds = if listed.contains("tandem-crds") {
            " (the CRDs stay, as Helm keeps crds/)"
        } else {
            ""
        };
        println!(
            "nothing {listed} made is left ({} objects){crds}",
            made.len()
        );
        Ok(())
    }

    /// Deletes the story's namespaces (a real cluster keeps them otherwise).
    pub(super) async fn delete_namespaces(&self) -> Result<(), StoryError> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        for ns in [&self.ns, &self.serving] {
            if ns.is_empty() {
                continue;
            }
            match api.delete(ns, &DeleteParams::default()).await {
                Ok(_) => println!("namespace {ns} deleted"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_err("delete a namespace")(e)),
            }
        }
        Ok(())
    }
}
