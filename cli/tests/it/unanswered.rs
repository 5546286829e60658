//! A controller that accepts connections and never answers (wedged, stopped with SIGSTOP,
//! a port taken by something else): a command gives up after the message timeout with an
//! error that says so, as Slurm's commands do after `MessageTimeout`, instead of hanging
//! the researcher's shell.

use std::io::Read as _;
use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_controller_that_never_answers_fails_the_command_after_the_message_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("controller.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    // Accepts every connection and reads what it is sent, but never writes a byte.
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let key = dir.path().join("cluster.key");
    std::fs::write(&key, "unused").unwrap();
    let cluster = dir.path().join("cluster.json");
    let file = serde_json::json!({
        "cluster_name": "wedged",
        "controller": "http://127.0.0.1:1",
        "key_file": key,
        "local_socket": socket,
    });
    std::fs::write(&cluster, file.to_string()).unwrap();

    for args in [&["squeue"][..], &["sbatch", "--wrap=true"]] {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_tandem-slurm"))
            .args(args)
            .env("TANDEM_CONFIG", &cluster)
            .env("TANDEM_MSG_TIMEOUT", "1")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("the controller did not answer within 1 s (TANDEM_MSG_TIMEOUT"),
            "{args:?}: {err}"
        );
        assert!(took < Duration::from_secs(30), "{args:?} took {took:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
