//! The `tandem` binary. Everything lives in the library; see `tandem_cli` for the layout.
fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(tandem_cli::main_from_env())
}
