//! The job launcher as a binary of its own, for the worker's integration tests, which run
//! the worker in-process (the `tandem` binary runs the same code as `tandem __job-exec`).
fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    tandem_worker::launch::exec::main(&args)
}
