//! The step's progress and output: which tasks have yet to report their exit, and their
//! lines written whole, prefixed by the task id with `-l`.

use std::collections::{HashMap, HashSet};

use tandem_proto::v1::StepTarget;

/// The tasks of a step that have not reported their exit yet.
#[derive(Debug)]
pub(super) struct Running {
    tasks: HashSet<u32>,
}

impl Running {
    /// Every task the step's targets launch.
    pub(super) fn new(targets: &[StepTarget]) -> Self {
        Self {
            tasks: targets
                .iter()
                .flat_map(|t| t.task_ids.iter().copied())
                .collect(),
        }
    }

    pub(super) fn exited(&mut self, task: u32) {
        self.tasks.remove(&task);
    }

    /// True once every task has exited.
    pub(super) fn all_exited(&self) -> bool {
        self.tasks.is_empty()
    }
}

pub(super) fn label_line(task: u32, line: &[u8], label: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + 8);
    if label {
        out.extend_from_slice(format!("{task}: ").as_bytes());
    }
    out.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

/// Writes complete lines (labelled when asked) and keeps a task's unfinished line for later,
/// so labels never land in the middle of a line.
pub(super) fn write_labelled<W: std::io::Write>(
    out: &mut W,
    partial: &mut HashMap<(u32, bool), Vec<u8>>,
    task: u32,
    is_err: bool,
    bytes: &[u8],
    label: bool,
) -> anyhow::Result<()> {
    let buf = partial.entry((task, is_err)).or_default();
    buf.extend_from_slice(bytes);
    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = buf.drain(..=pos).collect();
        out.write_all(&label_line(task, &line, label))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_is_over_when_the_last_task_of_every_node_exits() {
        let target = |node: &str, ids: &[u32]| StepTarget {
            node: node.into(),
            task_ids: ids.to_vec(),
            ..StepTarget::default()
        };
        let mut running = Running::new(&[target("n1", &[0, 1]), target("n2", &[2])]);
        assert!(!running.all_exited());
        running.exited(2);
        running.exited(2);
        running.exited(7);
        assert!(!running.all_exited(), "tasks 0 and 1 on n1 still run");
        running.exited(0);
        assert!(!running.all_exited(), "task 1 still runs");
        running.exited(1);
        assert!(
            running.all_exited(),
            "no need to wait for the streams to end"
        );
    }
}
