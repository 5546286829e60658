//! The controller's integration tests, one module per subject, in one test binary.
//!
//! Each file of `tests/` used to be a binary of its own, each linking the controller and its
//! dependencies; as modules of one binary they link once. They share [`support`] (the
//! controller in-process on 127.0.0.1:0 with its own temp store per test) and no
//! process-wide state: no test sets an environment variable or the current directory, so
//! they may run side by side on the harness's threads as the tests of one file always have.
//!
//! Run one subject with a filter on its module:
//! `cargo test -p tandem-controller --test it bridge::`.

mod support;

mod abuse;
mod accounting;
mod autoscale;
mod bridge;
mod controller;
mod decoders;
mod store_compat;
