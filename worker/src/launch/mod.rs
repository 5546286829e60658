//! Starting batch scripts and deciding how they end.
//!
//! - `env`, `output`, `limits`: pure rules (environment, file names, termination).
//! - `process`: the one place that turns a job into a process.

pub mod env;
pub mod limits;
pub mod output;
pub mod process;
