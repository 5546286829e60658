//! Waiting with a deadline: every condition the story waits for is polled until [`LONG`]
//! and fails with the last thing it saw; the waits that need the operator or the bridge
//! fail at once if one of them exited.

use std::time::{Duration, Instant};

use super::procs::Proc;
use super::{LONG, Story, StoryError, failed, kube_err};

impl Story<'_> {
    pub(super) async fn wait_ready(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
        n: usize,
    ) -> Result<(), StoryError> {
        let api = self.api(kind, plural);
        let what = format!("{kind} {name} to have {n} ready pods");
        self.poll(&what, || async {
            let o = api.get(name).await.map_err(kube_err(&what))?;
            let ready = o.data["status"]["readyReplicas"].as_u64().unwrap_or(0);
            Ok((ready == n as u64)
                .then_some(())
                .ok_or(format!("{ready} ready")))
        })
        .await
    }

    /// Polls `f` every half second until it returns `Ok(Ok(v))`; `Ok(Err(last))` is "not
    /// yet" with what it saw, for the failure message.
    pub(super) async fn poll<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, StoryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, String>, StoryError>>,
    {
        let began = Instant::now();
        loop {
            let last = match f().await? {
                Ok(v) => return Ok(v),
                Err(last) => last,
            };
            if began.elapsed() > LONG {
                return Err(failed(
                    format!("waiting for {what}"),
                    format!("timed out after {LONG:?}; last: {last}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Fails if the operator or the bridge exited.
    pub(super) fn alive(&self) -> Result<(), StoryError> {
        // Checked through /proc, so a shared borrow of the story will do.
        for (name, p) in [
            ("tandem-operator", &self.operator),
            ("tandem-bridge", &self.bridge),
        ] {
            if let Some(p) = p
                && !pid_alive(p)
            {
                return Err(failed(name, format!("exited:\n{}", p.tail(30))));
            }
        }
        Ok(())
    }
}

/// Whether the process behind `p` still runs (a zombie counts as gone).
fn pid_alive(p: &Proc) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.id())).unwrap_or_default();
    // The state is the field after the parenthesised command name.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}
