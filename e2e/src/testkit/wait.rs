//! Waits that explain themselves: each watches one object (or polls a pod's log) and, on
//! timeout, says what it waited for and the last state it saw. Apart from
//! [`super::TestCluster`] because they need only an `Api`, on any cluster.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

/// A wait that timed out: what was expected, and the last state seen.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {kind} {name} {what}; last observed: {last}")]
pub struct WaitError {
    pub kind: String,
    pub name: String,
    pub what: String,
    pub timeout: Duration,
    /// The last object seen, as JSON, or why there is none.
    pub last: String,
}

/// Waits until the object `name` satisfies `cond` (checked on every version seen) and
/// returns it. `what` completes "waiting for pod x ..." in the error.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&K) -> bool,
) -> Result<K, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + serde::Serialize + 'static,
    K::DynamicType: Default,
{
    match observe(api, name, timeout, |o| o.is_some_and(&cond)).await {
        (true, Some(obj)) => Ok(obj),
        (_, last) => Err(wait_error::<K>(name, what, timeout, last.as_ref(), false)),
    }
}

/// Waits until `name` is gone and returns the last version seen before it went (what
/// the deleting party wrote last), if any was seen.
pub async fn wait_for_deletion<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> Result<Option<K>, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + serde::Serialize + 'static,
    K::DynamicType: Default,
{
    match observe(api, name, timeout, |o| o.is_none()).await {
        (true, last) => Ok(last),
        (false, last) => Err(wait_error::<K>(
            name,
            "to be deleted",
            timeout,
            last.as_ref(),
            true,
        )),
    }
}

fn wait_error<K: Resource + serde::Serialize>(
    name: &str,
    what: &str,
    timeout: Duration,
    last: Option<&K>,
    exists: bool,
) -> WaitError
where
    K::DynamicType: Default,
{
    let last = match last {
        Some(obj) => {
            serde_json::to_string_pretty(obj).unwrap_or_else(|e| format!("<unprintable: {e}>"))
        }
        None if exists => "<never seen>".into(),
        None => "<not found (never seen, or deleted)>".into(),
    };
    WaitError {
        kind: K::kind(&K::DynamicType::default()).to_lowercase(),
        name: name.to_owned(),
        what: what.to_owned(),
        timeout,
        last,
    }
}

/// Watches one object; `done` sees `Some(current)` or `None` once it is gone. Returns
/// whether `done` held, and the last version seen.
async fn observe<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    done: impl Fn(Option<&K>) -> bool,
) -> (bool, Option<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(api.clone(), config).boxed();
    let mut last: Option<K> = None;
    let mut present = false;
    let mut listed = false;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => return (false, last),
        };
        match event {
            Ok(Event::Init) => present = false,
            Ok(Event::InitApply(obj)) => {
                present = true;
                last = Some(obj);
                continue; // judged at InitDone, when the list is complete
            }
            Ok(Event::InitDone) => listed = true,
            Ok(Event::Apply(obj)) => {
                present = true;
                last = Some(obj);
            }
            Ok(Event::Delete(obj)) => {
                present = false;
                last = Some(obj);
            }
            // The watcher retries on its own; a test waiting is not the place to fail.
            Err(_) => continue,
        }
        if listed && done(if present { last.as_ref() } else { None }) {
            return (true, last);
        }
    }
}

/// Polls the pod's log (through the API server's `log` subresource) until it contains
/// `needle`; returns the whole log.
pub async fn wait_for_log(
    pods: &Api<Pod>,
    name: &str,
    needle: &str,
    timeout: Duration,
) -> Result<String, WaitError> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("<no log read yet>");
    while Instant::now() < deadline {
        match pods.logs(name, &kube::api::LogParams::default()).await {
            Ok(text) if text.contains(needle) => return Ok(text),
            Ok(text) => last = format!("log so far: {text:?}"),
            Err(e) => last = format!("log request failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(WaitError {
        kind: "pod".into(),
        name: name.to_owned(),
        what: format!("to log {needle:?}"),
        timeout,
        last,
    })
}
