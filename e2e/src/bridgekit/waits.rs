//! [`BridgeEnv`]'s waits: on pods, on the CLI's output, on any condition, on Events. Each
//! panics after [`T`] with what it waited for, what it last saw and the processes' logs.
//! Apart from the environment because they use only its public face.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams};

use super::{BridgeEnv, T, describe, list_bounded};

impl BridgeEnv {
    /// Lists the pods `lp` selects in `api` until `cond` holds for them; them. Panics after
    /// [`T`] with `what`, the pods last seen and the logs.
    pub async fn wait_pods(
        &self,
        api: &Api<Pod>,
        lp: &ListParams,
        what: &str,
        cond: impl Fn(&[Pod]) -> bool,
    ) -> Vec<Pod> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let pods = list_bounded(api, lp).await.unwrap_or_default();
            if cond(&pods) {
                return pods;
            }
            if tokio::time::Instant::now() >= deadline {
                let seen: Vec<String> = pods.iter().map(describe).collect();
                panic!(
                    "timed out waiting for {what}; pods:\n{}\n{}",
                    seen.join("\n"),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `tandem <args>` until `cond` holds for its output; the output.
    pub async fn wait_cli(&self, args: &[&str], what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let out = self.try_cli(args).unwrap_or_default();
            if cond(&out) {
                return out;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out waiting for {what}; `tandem {}` said:\n{out}\n{}",
                    args.join(" "),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `f` every 200 ms until it holds; panics after [`T`] with `what` and the logs.
    pub async fn wait_until(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + T;
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Lists the Events of `api` until one satisfies `cond`; it. Panics after [`T`] with
    /// `what` and the Events last seen.
    pub async fn wait_event(
        &self,
        api: &Api<KubeEvent>,
        what: &str,
        cond: impl Fn(&KubeEvent) -> bool,
    ) -> KubeEvent {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let evs = list_bounded(api, &ListParams::default())
                .await
                .unwrap_or_default();
            if let Some(e) = evs.iter().find(|e| cond(e)) {
                return e.clone();
            }
            if tokio::time::Instant::now() >= deadline {
                let seen: Vec<String> = evs
                    .iter()
                    .map(|e| {
                        format!(
                            "{:?} {:?} on {:?}: {:?}",
                            e.type_,
                            e.reason,
                            e.regarding.as_ref().and_then(|r| r.name.as_deref()),
                            e.note
                        )
                    })
                    .collect();
                panic!(
                    "timed out waiting for {what}; events:\n{}\n{}",
                    seen.join("\n"),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
