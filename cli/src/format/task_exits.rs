//! srun's report of tasks that did not succeed, in Slurm 22.05's lines: one per node and
//! outcome, `srun: error: n1: tasks 0-1: Exited with exit code 3`, `srun: error: n2: task 2:
//! Killed`. Pure: the caller gathers the exits.

use std::collections::BTreeMap;

/// How one task ended: its exit code, or the signal that ended it (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaskEnd {
    pub exit_code: i32,
    pub signal: i32,
}

/// The lines for every task that exited non-zero or by a signal, node by node in `nodes`
/// order (each node with its tasks), outcomes in the order of their first task.
pub fn failure_lines(nodes: &[(&str, &[u32])], ends: &BTreeMap<u32, TaskEnd>) -> Vec<String> {
    let mut lines = Vec::new();
    for (node, tasks) in nodes {
        let mut outcomes: Vec<(TaskEnd, Vec<u32>)> = Vec::new();
        let mut sorted: Vec<u32> = tasks.to_vec();
        sorted.sort_unstable();
        for t in sorted {
            let Some(end) = ends.get(&t) else { continue };
            if end.exit_code == 0 && end.signal == 0 {
                continue;
            }
            match outcomes.iter_mut().find(|(e, _)| e == end) {
                Some((_, ids)) => ids.push(t),
                None => outcomes.push((*end, vec![t])),
            }
        }
        for (end, ids) in outcomes {
            let what = if end.signal != 0 {
                signal_words(end.signal)
            } else {
                format!("Exited with exit code {}", end.exit_code)
            };
            let noun = if ids.len() == 1 { "task" } else { "tasks" };
            lines.push(format!(
                "srun: error: {node}: {noun} {}: {what}",
                ranges(&ids)
            ));
        }
    }
    lines
}

/// `0,1,2,5` -> `0-2,5` (ids sorted).
fn ranges(ids: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// What `strsignal(3)` says of the signal, as srun prints it.
fn signal_words(signal: i32) -> String {
    super::slurm_json::signal_name(signal).map_or_else(|| format!("Signal {signal}"), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(v: &[(u32, i32, i32)]) -> BTreeMap<u32, TaskEnd> {
        v.iter()
            .map(|&(t, exit_code, signal)| (t, TaskEnd { exit_code, signal }))
            .collect()
    }

    /// Slurm 22.05: `srun -n2 sh -c 'exit 3'` on one node, `srun -n1 false`.
    #[test]
    fn failures_group_by_node_and_outcome_as_slurms() {
        let n1: &[u32] = &[0, 1];
        assert_eq!(
            failure_lines(&[("n1", n1)], &ends(&[(0, 3, 0), (1, 3, 0)])),
            ["srun: error: n1: tasks 0-1: Exited with exit code 3"]
        );
        assert_eq!(
            failure_lines(&[("n1", &[0])], &ends(&[(0, 1, 0)])),
            ["srun: error: n1: task 0: Exited with exit code 1"]
        );
        let n2: &[u32] = &[2, 3, 5];
        assert_eq!(
            failure_lines(
                &[("n1", n1), ("n2", n2)],
                &ends(&[(0, 0, 0), (1, 0, 9), (2, 4, 0), (3, 4, 0), (5, 4, 0)])
            ),
            [
                "srun: error: n1: task 1: Killed",
                "srun: error: n2: tasks 2-3,5: Exited with exit code 4",
            ]
        );
        assert!(failure_lines(&[("n1", n1)], &ends(&[(0, 0, 0), (1, 0, 0)])).is_empty());
        assert_eq!(signal_words(50), "Signal 50");
    }
}
