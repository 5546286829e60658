//! Process kubelet (see the crate docs).
