//! A fake controller for the reconcilers' tests: answers from a state the test sets, and
//! records every call in order, so a test can assert what the operator asked of it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tandem_net::auth::ClusterKey;

use super::{BatchControl, BatchFuture};
use crate::accounting::{Change, Current};
use crate::connections::{Batch, Connect};
use crate::plan::BatchNode;

/// What the fake answers, and what it was asked.
#[derive(Debug, Default)]
pub struct FakeState {
    /// `ListNodes`' answer (filtered by name when names are given).
    pub nodes: Vec<BatchNode>,
    pub referenced: BTreeSet<String>,
    pub current: Current,
    /// Every call, as `Name(args)`, in order; connections as `connect(endpoint)`.
    pub calls: Vec<String>,
}

/// A [`BatchControl`] and [`Connect`] over one shared [`FakeState`].
#[derive(Clone, Debug, Default)]
pub struct FakeBatch(pub Arc<Mutex<FakeState>>);

impl FakeBatch {
    fn record(&self, call: String) -> std::sync::MutexGuard<'_, FakeState> {
        let mut s = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.calls.push(call);
        s
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .calls
            .clone()
    }
}

impl BatchControl for FakeBatch {
    fn nodes<'a>(&'a self, names: &'a [String]) -> BatchFuture<'a, Vec<BatchNode>> {
        let s = self.record(format!("ListNodes({})", names.join(",")));
        let out = s
            .nodes
            .iter()
            .filter(|n| names.is_empty() || names.contains(&n.name))
            .cloned()
            .collect();
        Box::pin(async move { Ok(out) })
    }

    fn update_node<'a>(
        &'a self,
        node: &'a str,
        state: &'a str,
        reason: &'a str,
    ) -> BatchFuture<'a, ()> {
        drop(self.record(format!("UpdateNode({node},{state},{reason})")));
        Box::pin(async { Ok(()) })
    }

    fn remove_node<'a>(
        &'a self,
        node: &'a str,
        force: bool,
        reason: &'a str,
    ) -> BatchFuture<'a, ()> {
        drop(self.record(format!("RemoveNode({node},{force},{reason})")));
        Box::pin(async { Ok(()) })
    }

    fn referenced_partitions(&self) -> BatchFuture<'_, BTreeSet<String>> {
        let out = self.record("ListJobs()".into()).referenced.clone();
        Box::pin(async move { Ok(out) })
    }

    fn accounting(&self) -> BatchFuture<'_, Current> {
        let out = self.record("ListAssociations()".into()).current.clone();
        Box::pin(async move { Ok(out) })
    }

    fn apply<'a>(&'a self, change: &'a Change) -> BatchFuture<'a, ()> {
        drop(self.record(format!("{change:?}")));
        Box::pin(async { Ok(()) })
    }
}

impl Connect for FakeBatch {
    fn connect<'a>(
        &'a self,
        endpoint: &'a str,
        _ca_pem: &'a str,
        _key: &'a ClusterKey,
    ) -> BoxFuture<'a, Result<Batch, String>> {
        drop(self.record(format!("connect({endpoint})")));
        let b: Batch = Arc::new(self.clone());
        Box::pin(async move { Ok(b) })
    }
}
