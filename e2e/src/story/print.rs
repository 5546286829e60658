//! What the story prints: a heading per step, the commands' output, `kubectl get pods -o
//! wide`, and on failure every pod's state and the components' logs (to stderr).

use std::io::Write as _;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{Story, StoryError, kube_err, table};

pub(super) fn say(what: &str) {
    println!("\n== {what}");
    let _ = std::io::stdout().flush();
}

pub(super) fn show(text: &str) {
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    let _ = std::io::stdout().flush();
}

impl Story<'_> {
    pub(super) async fn pods_table(&self, ns: &str) -> Result<String, StoryError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list pods"))?
            .items;
        Ok(table::pods_wide(
            &list,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
        ))
    }

    /// On failure: every pod's state and the components' logs.
    pub(super) async fn dump(&mut self) {
        for ns in [self.ns.clone(), self.serving.clone()] {
            if ns.is_empty() {
                continue;
            }
            if let Ok(t) = self.pods_table(&ns).await {
                eprintln!("--- pods in {ns}\n{t}");
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            for p in pods
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let name = p.metadata.name.clone().unwrap_or_default();
                let log = pods
                    .logs(
                        &name,
                        &kube::api::LogParams {
                            tail_lines: Some(20),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap_or_else(|e| format!("<no log: {e}>"));
                eprintln!("--- log of {ns}/{name}\n{log}");
            }
        }
        for p in [&self.operator, &self.bridge].into_iter().flatten() {
            eprintln!("--- {}\n{}", p.log.display(), p.tail(30));
        }
    }
}
