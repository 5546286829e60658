//! The story against a real cluster (`KUBECONFIG`): only what needs no process kubelet, the
//! four installs, the check that their objects exist, the uninstalls and the check that
//! nothing is left, and the story's namespaces deleted. Every other step is reported as
//! `SKIP <step>: <why>`.

use super::{Story, StoryError};
use crate::testkit::skip;

/// The steps after the install, each of which needs the process kubelet, and why.
const KUBELET_STEPS: [(&str, &str); 5] = [
    (
        "serving",
        "the bridge runs here as a process and must reach the controller's cluster IP from this machine",
    ),
    (
        "research",
        "`kubectl exec` into the login pod runs the pod's command here (the process kubelet)",
    ),
    (
        "autoscale",
        "the story reads the controller's metrics at its cluster IP from this machine",
    ),
    ("flip", "it needs the serving and research steps"),
    ("sshare", "`kubectl exec` into the login pod"),
];

impl Story<'_> {
    /// [`super::run_real`] after the story is made: installs, checks, skips the rest,
    /// uninstalls. The number of objects the releases made.
    pub(super) async fn play_real(&mut self) -> Result<usize, StoryError> {
        let result = self.install_charts().await;
        let result = match result {
            Ok(()) => self.check_installed().await,
            Err(e) => Err(e),
        };
        if result.is_ok() {
            for (step, why) in KUBELET_STEPS {
                skip(step, why);
            }
        }
        let made = self.releases.iter().map(|r| r.made.len()).sum();
        let uninstalled = self
            .uninstall(
                &[
                    "tandem-bridge",
                    "tandem-cluster",
                    "tandem-operator",
                    "tandem-crds",
                ],
                result.is_ok(),
            )
            .await;
        let deleted = self.delete_namespaces().await;
        result?;
        uninstalled?;
        deleted?;
        Ok(made)
    }
}
