//! Test kit for e2e tests (see the crate docs).
