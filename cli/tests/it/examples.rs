//! The README's examples as a user meets them: `tandem demo` submits every
//! `examples/batch/*.sbatch` unchanged to a fresh local cluster and fails unless each job
//! COMPLETED. On top of that, the multi-node example must have really exchanged data: both
//! ranks, started by `srun` on two different nodes, report the all-reduced vector.

use std::path::Path;
use std::process::Command;

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

#[test]
fn every_batch_example_completes_and_the_multinode_ranks_all_reduce_across_two_nodes() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/batch");
    let out = Command::new(TANDEM)
        .args(["demo", "--nodes", "3", "--timeout", "120", "--examples"])
        .arg(&examples)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tandem demo failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("example jobs COMPLETED"), "{stdout}");

    // The two ranks ran on two distinct nodes and each checked the same sum:
    // rank r contributes (r+1)*[1,2,3,4], so two ranks sum to [3,6,9,12].
    let ranks: Vec<(&str, &str)> = stdout
        .lines()
        .filter(|l| l.ends_with("all-reduce sum [3, 6, 9, 12] ok"))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let rank = w.nth(1)?;
            let node = w.nth(1)?.trim_end_matches(':');
            Some((rank, node))
        })
        .collect();
    let mut seen: Vec<&str> = ranks.iter().map(|r| r.0).collect();
    seen.sort_unstable();
    assert_eq!(seen, ["0/2", "1/2"], "{stdout}");
    assert_ne!(
        ranks[0].1, ranks[1].1,
        "the ranks ran on one node: {stdout}"
    );
    assert!(
        stdout.contains("rank 0: rank 1 joined from"),
        "the master saw rank 1 connect: {stdout}"
    );
}
