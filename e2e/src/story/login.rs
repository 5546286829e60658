//! The login pod: commands run in it as `kubectl exec pool-login-0 -- argv` would (the
//! process kubelet runs the pod's command here), polled until their output shows something,
//! and `sbatch --parsable` from it.

use super::values::LOGIN_SET;
use super::{Story, StoryError, failed};

impl Story<'_> {
    /// Runs `argv` in the login pod, as `kubectl exec pool-login-0 -- argv`.
    pub(super) async fn login(&self, argv: &[&str]) -> Result<String, StoryError> {
        let pod = format!("{LOGIN_SET}-0");
        let out = self
            .cluster
            .exec(&self.ns, &pod, None, argv)
            .await
            .map_err(|e| {
                failed(
                    format!("kubectl exec {pod} -- {}", argv.join(" ")),
                    format!("{e:#}"),
                )
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(failed(
                format!("kubectl exec {pod} -- {}", argv.join(" ")),
                format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
            ));
        }
        Ok(stdout)
    }

    /// `login(argv)` every half second until `done(output)`; the output.
    pub(super) async fn poll_login(
        &self,
        argv: &[&str],
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<String, StoryError> {
        self.poll(&format!("{} to show {what}", argv.join(" ")), || async {
            let o = self.login(argv).await?;
            Ok(if done(&o) { Ok(o) } else { Err(o) })
        })
        .await
    }

    pub(super) async fn sbatch(&self, args: &[&str]) -> Result<String, StoryError> {
        let mut argv = vec!["sbatch", "--parsable"];
        argv.extend_from_slice(args);
        let id = self.login(&argv).await?.trim().to_owned();
        if id.parse::<u64>().is_err() {
            return Err(failed("sbatch", format!("printed {id:?}, not a job id")));
        }
        Ok(id)
    }
}
