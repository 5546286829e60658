//! CLI round trips against a real local cluster, printed as JSON lines (not a test).
//!
//! `cargo bench -p tandem-cli --bench cli [-- N]` starts `tandem up` in a temp dir and
//! measures, as a researcher sees them:
//! - `sbatch_round_trip_ms`: sequential `sbatch --wrap true` processes (exec, connect,
//!   durable submit, print), median and p90 of N (default 200);
//! - `squeue_ms`: one `squeue` over everything submitted (pending and finished jobs mixed);
//! - `submit_to_running_ms`: submit to the job's start time as the controller records it
//!   (whole-second resolution of the start timestamp, so only a coarse upper bound).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let up = Command::new(TANDEM)
        .args([
            "up",
            "--no-default-config",
            "--nodes",
            "4",
            "--gpus-per-node",
            "8",
            "--state-dir",
        ])
        .arg(&state)
        .output()
        .expect("tandem up");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let config = state.join("cluster.json");
    let cli = |args: &[&str]| {
        Command::new(TANDEM)
            .args(args)
            .env("TANDEM_CONFIG", &config)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run tandem")
    };

    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = cli(&["sbatch", "--parsable", "--hold", "--wrap", "true"]);
        samples.push(t.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{{\"metric\":\"sbatch_round_trip_ms\",\"n\":{n},\"median\":{:.2},\"p90\":{:.2},\"min\":{:.2}}}",
        ms(samples[n / 2]),
        ms(samples[n * 9 / 10]),
        ms(samples[0])
    );

    let t = Instant::now();
    let out = cli(&["squeue"]);
    let elapsed = t.elapsed();
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    println!(
        "{{\"metric\":\"squeue_ms\",\"jobs\":{},\"ms\":{:.2}}}",
        lines.saturating_sub(1),
        ms(elapsed)
    );

    // Release nothing: the held jobs stay pending; one fresh job measures submit-to-start.
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let out = cli(&["sbatch", "--parsable", "--wrap", "sleep 1"]);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let out = cli(&["squeue", "-h", "-j", &id, "-o", "%t"]);
        if String::from_utf8_lossy(&out.stdout).trim() == "R" {
            let t1 = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            println!(
                "{{\"metric\":\"submit_to_running_observed_ms\",\"ms\":{:.1},\"note\":\"includes squeue polling\"}}",
                (t1 - t0) * 1000.0
            );
            break;
        }
    }
    let _ = Command::new(TANDEM)
        .args(["down", "--state-dir"])
        .arg(&state)
        .output();
}
