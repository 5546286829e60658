//! Step 4: the researcher, in the login pod, submits the 2-node all-reduce example and the
//! sweep array from `examples/batch`; while they wait the worker set scales ([`super::hpa`]),
//! and the queue and the nodes are shown as they change until both jobs are done.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::manifests::RESEARCH;
use super::print::{say, show};
use super::{LONG, Story, StoryError, failed, io_err};

impl Story<'_> {
    pub(super) async fn research(
        &mut self,
    ) -> Result<(Vec<String>, usize, (i64, i64)), StoryError> {
        let examples = examples_dir();
        let work = self.dir.path().join("work");
        std::fs::create_dir_all(&work).map_err(io_err("the jobs' directory"))?;
        let w = work.to_string_lossy().into_owned();
        let allreduce = examples.join("multinode-allreduce.sbatch");
        let sweep = examples.join("sweep-array.sbatch");
        say(
            "a researcher, in the login pod: sbatch multinode-allreduce.sbatch; sbatch sweep-array.sbatch",
        );
        let a = self
            .sbatch(&["-A", RESEARCH, "--chdir", &w, &allreduce.to_string_lossy()])
            .await?;
        let b = self
            .sbatch(&["-A", RESEARCH, "--chdir", &w, &sweep.to_string_lossy()])
            .await?;
        println!("Submitted batch job {a}\nSubmitted batch job {b}");
        let scaled = self.autoscale(&b).await?;

        // Show the queue and the nodes as they change, until both jobs are done.
        let began = Instant::now();
        let mut last = String::new();
        let ids = format!("{a},{b}");
        loop {
            self.alive()?;
            let q = self
                .login(&["squeue", "-o", "%.10i %.20j %.9P %.8u %.2t %.6D %R"])
                .await?;
            let i = self.login(&["sinfo", "-N", "-o", "%N %t %k"]).await?;
            let snap = format!("{q}{i}");
            if snap != last {
                say(&format!(
                    "squeue; sinfo -N -o '%N %t %k'   (t+{}s)",
                    began.elapsed().as_secs()
                ));
                show(&snap);
                last = snap;
            }
            let active = self
                .login(&["squeue", "-h", "-j", &ids, "-o", "%i"])
                .await?;
            if active.trim().is_empty() {
                break;
            }
            if began.elapsed() > LONG {
                return Err(failed(
                    "the research jobs",
                    format!("still queued after {LONG:?}:\n{active}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        say(&format!(
            "sacct -j {ids} -X -o JobID,JobName,Account,State,NNodes,NodeList"
        ));
        let sacct = self
            .login(&[
                "sacct",
                "-j",
                &ids,
                "-X",
                "-o",
                "JobID,JobName%12,Account,State,NNodes,NodeList%16",
            ])
            .await?;
        show(&sacct);
        // The all-reduce job's own words first: they say why, if it failed.
        let out = work.join(format!("allreduce-{a}.out"));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        say(&format!("cat allreduce-{a}.out"));
        show(&text);
        let states = self
            .login(&["sacct", "-j", &ids, "-X", "-n", "-P", "-o", "JobID,State"])
            .await?;
        let not_done: Vec<&str> = states
            .lines()
            .filter(|l| !l.ends_with("|COMPLETED"))
            .collect();
        if !not_done.is_empty() || states.lines().count() < 9 {
            return Err(failed(
                "the research jobs",
                format!("not all COMPLETED:\n{states}"),
            ));
        }
        let array_tasks = states
            .lines()
            .filter(|l| l.starts_with(&format!("{b}_")))
            .count();
        if !text.contains("all-reduce over 2 nodes: ok") {
            return Err(failed("the all-reduce job", text));
        }
        let mut nodes: Vec<String> = text
            .lines()
            .filter(|l| l.ends_with("ok") && l.starts_with("rank "))
            .filter_map(|l| l.split_whitespace().nth(3))
            .map(|n| n.trim_end_matches(':').to_owned())
            .collect();
        nodes.sort();
        nodes.dedup();
        if nodes.len() != 2 {
            return Err(failed(
                "the all-reduce job",
                format!("ranks not on two nodes:\n{text}"),
            ));
        }
        Ok((nodes, array_tasks, scaled))
    }
}

/// `examples/batch` of this source tree.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/batch")
}
