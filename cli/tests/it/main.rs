//! The CLI's integration tests, one module per subject, in one test binary.
//!
//! Each file of `tests/` used to be a binary of its own, and each linked the CLI with the
//! controller, the worker and their dependencies: sixteen links of the same code on every
//! change. As modules of one binary they link once. They share [`support`] (a local cluster
//! per test, in its own temp dir, with its own cgroup subtree) and no process-wide state: no
//! test sets an environment variable or the current directory, so they may run side by side
//! on the harness's threads as the tests of one file always have.
//!
//! Run one subject with a filter on its module: `cargo test -p tandem-cli --test it compat::`.

mod support;

mod accounting;
mod autoscale;
mod batch;
mod cli;
mod compat;
mod completing;
mod crash;
mod examples;
mod isolation;
mod linkage;
mod nodelay;
mod policy;
mod scripts;
mod security;
mod srun_layout;
mod unanswered;
