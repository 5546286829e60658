//! The binary without a cluster: multi-call dispatch, links, help, and errors that must not
//! need a controller.

use crate::support;

use std::process::Command;

use support::{TANDEM, assert_one_line_error, make_links, tandem_links};

#[test]
fn links_make_argv0_dispatch_work() {
    let dir = tempfile::tempdir().unwrap();
    let bin = make_links(dir.path());
    for name in [
        "sbatch", "squeue", "scancel", "sinfo", "sacct", "scontrol", "srun",
    ] {
        assert!(bin.join(name).exists(), "{name}");
    }
    // argv[0] = scontrol: host lists need no cluster.
    let out = Command::new(bin.join("scontrol"))
        .args(["show", "hostnames", "gpu-[01-03,07]"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "gpu-01\ngpu-02\ngpu-03\ngpu-07\n"
    );
    // Errors carry the name the user typed.
    let out = Command::new(bin.join("sbatch"))
        .args(["--bogus"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "sbatch", "--bogus");
    // A second run refuses to clobber without --force.
    assert_one_line_error(&tandem_links(&bin), "tandem links", "exists");
}

#[test]
fn subcommands_and_help() {
    let out = Command::new(TANDEM)
        .args(["scontrol", "show", "hostlist", "n3,n1,n2"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n[1-3]\n");
    let out = Command::new(TANDEM)
        .args(["sbatch", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--job-name"));
}

#[test]
fn no_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(TANDEM)
        .args(["squeue"])
        .env("TANDEM_CONFIG", dir.path().join("missing.json"))
        .env_remove("TANDEM_CONTROLLER")
        .output()
        .unwrap();
    assert_one_line_error(&out, "squeue", "tandem up");
}

/// Slurm 22.05's scontrol refuses to drain or down a node without a reason before it asks
/// the controller, in these words, exit code 1; with a reason it goes on (here to the
/// missing cluster).
#[test]
fn draining_a_node_needs_a_reason_as_in_slurm() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(TANDEM)
            .arg("scontrol")
            .args(args)
            .env("TANDEM_CONFIG", dir.path().join("missing.json"))
            .env_remove("TANDEM_CONTROLLER")
            .output()
            .unwrap()
    };
    for state in ["State=DRAIN", "state=down"] {
        let out = run(&["update", "NodeName=node-1", state]);
        assert_eq!(out.status.code(), Some(1), "{state}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "You must specify a reason when DOWNING or DRAINING a node. Request denied\n"
        );
    }
    let out = run(&["update", "NodeName=node-1", "State=DRAIN", "Reason=disk"]);
    assert_one_line_error(&out, "scontrol", "tandem up");
    let out = run(&["update", "NodeName=node-1", "State=RESUME"]);
    assert_one_line_error(&out, "scontrol", "tandem up");
}

/// The Slurm commands' binary is linked at a fixed address (`build.rs`: no relocations for
/// the loader at every call); the daemons' binary stays position-independent.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn only_the_commands_binary_is_position_dependent() {
    // e_type, the 16-bit little-endian field at offset 16 of an x86-64/aarch64 ELF header.
    let e_type = |path: &str| {
        use std::io::Read;
        let mut bytes = [0u8; 18];
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut bytes))
            .unwrap();
        assert_eq!(&bytes[..4], b"\x7fELF", "{path}");
        u16::from_le_bytes([bytes[16], bytes[17]])
    };
    const ET_EXEC: u16 = 2;
    const ET_DYN: u16 = 3;
    assert_eq!(e_type(env!("CARGO_BIN_EXE_tandem-slurm")), ET_EXEC);
    assert_eq!(e_type(TANDEM), ET_DYN);
}

/// `tandem-slurm` starts at C's `main`, without Rust's runtime start-up
/// (`src/bin/tandem-slurm.rs`); what of it the commands rely on it does itself.
#[test]
fn the_commands_binary_keeps_what_rusts_start_up_gave_it() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let bin = env!("CARGO_BIN_EXE_tandem-slurm");
    // Started with stdout closed: it writes to /dev/null, not to whatever it opens next.
    let out = Command::new("sh")
        .args([
            "-c",
            r#"exec >&-; exec "$0" scontrol show hostnames 'n[1-3]'"#,
            bin,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // A reader that went away is an error the command sees (EPIPE), not a SIGPIPE that
    // kills it: more than a pipe's buffer of host names into a pipe already closed.
    let mut child = Command::new(bin)
        .args(["scontrol", "show", "hostnames", "node-[1-40000]"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), None, "{status:?}");
    // Output is flushed at exit, to a pipe as to a terminal.
    let out = Command::new(bin)
        .args(["scontrol", "show", "hostlist", "n3,n1,n2"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n[1-3]\n");
    assert!(out.status.success());
}
