//! In-memory Kubernetes API server (see the crate docs).
