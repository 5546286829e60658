//! Starting batch scripts and deciding how they end.
//!
//! - `env`, `output`, `limits`: pure rules (environment, file names, termination).
//! - `envp`: the environment block a job process execs with (its `SLURM_TASK_PID` filled in
//!   by the child).
//! - `process`: the one place that turns a job into a process.
//! - `exec`: the launcher that puts it in its cgroup and drops to the user before `exec`.
//! - `join`: the cgroup join in the forked child, when there is no user to drop to.
//! - `vfork`: the same join for a batch script without copying the worker (`CLONE_VM`).

pub mod env;
pub mod envp;
pub mod exec;
pub mod join;
pub mod limits;
pub mod output;
pub mod process;
pub mod vfork;
