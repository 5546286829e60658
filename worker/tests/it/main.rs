//! The worker's integration tests, one module per subject, in one test binary.
//!
//! Each file of `tests/` used to be a binary of its own, each linking the worker and its
//! dependencies; as modules of one binary they link once. They share [`support`] (a fake
//! controller and a real worker per test, each worker in its own temp dir and cgroup
//! subtree) and no process-wide state: no test sets an environment variable or the current
//! directory, so they may run side by side on the harness's threads as the tests of one file
//! always have.
//!
//! Run one subject with a filter on its module: `cargo test -p tandem-worker --test it step::`.

mod support;

mod batch;
mod completing;
mod decoders;
mod isolation;
mod step;
