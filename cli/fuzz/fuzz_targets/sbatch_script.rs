//! Batch script text in, `#SBATCH` directives and then a job spec or a clean error out, never
//! a panic: the path `sbatch script.sh` takes before it talks to the controller
//! (`directives::parse`, `JobOpts::from_directives`, `JobOpts::to_spec`).

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use tandem_cli::directives;
use tandem_cli::opts::{JobOpts, SubmitContext};

fuzz_target!(|data: &[u8]| {
    // sbatch reads scripts as UTF-8 and rejects anything else before parsing.
    if let Ok(script) = std::str::from_utf8(data) {
        check(script);
    }
});

fn check(script: &str) {
    let parsed = match directives::parse(script) {
        Ok(d) => d,
        Err(e) => return one_line(&e),
    };
    let lines = script.lines().count();
    for d in &parsed {
        assert!(
            d.line >= 2 && d.line <= lines,
            "directive line {} of {lines}",
            d.line
        );
        assert!(
            !d.args.is_empty(),
            "empty directive kept at line {}",
            d.line
        );
    }
    let opts = match JobOpts::from_directives(&parsed) {
        Ok(o) => o,
        Err(e) => return one_line(&e),
    };
    match opts.to_spec(script.to_string(), Vec::new(), "fuzz.sh", &context()) {
        Ok(spec) => assert!(spec.nodes_min <= spec.nodes_max),
        Err(e) => one_line(&e),
    }
}

/// The CLI prints errors as `sbatch: error: <one line>`.
fn one_line(e: &dyn std::fmt::Display) {
    let text = e.to_string();
    assert!(
        !text.is_empty() && !text.contains('\n'),
        "error is not one line: {text:?}"
    );
}

fn context() -> SubmitContext {
    SubmitContext {
        env: vec![
            ("HOME".into(), "/home/fuzz".into()),
            ("USER".into(), "fuzz".into()),
            ("PATH".into(), "/usr/bin".into()),
        ],
        cwd: PathBuf::from("/work/fuzz"),
        hostname: "login-1".into(),
        now: 1_700_000_000,
        utc_offset_s: Some(3600),
    }
}
