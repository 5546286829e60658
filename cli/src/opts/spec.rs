//! Layer 3 of the job options: the merged [`JobOpts`] validated and translated into the wire
//! [`JobSpec`], with the environment the job gets (`--export`) and the variables sbatch adds
//! to it; pure, given a [`SubmitContext`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tandem_proto::v1::JobSpec;

use super::{Export, JobOpts, NodeRange, OpenMode, OptsError, SubmitContext};

impl JobOpts {
    /// The working directory the job will run in.
    pub fn workdir(&self, cwd: &Path) -> PathBuf {
        match &self.chdir {
            Some(d) => cwd.join(d),
            None => cwd.to_path_buf(),
        }
    }

    /// The variables Slurm's sbatch adds to the environment it sends, repeating the request
    /// as it was made: `SLURM_GPUS` for `--gpus`, `SLURM_GPUS_PER_NODE` for
    /// `--gpus-per-node` (not `--gres`), `SLURM_GPUS_PER_TASK` for `--gpus-per-task`; and
    /// for an `--export` other than `ALL`, `SLURM_EXPORT_ENV` (which an `srun` inside the
    /// job takes as its own `--export`) and `SLURM_GET_USER_ENV=1`.
    fn request_environment(
        &self,
        mut env: BTreeMap<String, String>,
    ) -> std::collections::HashMap<String, String> {
        if let Some(export) = &self.export
            && *export != Export::All(Vec::new())
        {
            env.insert("SLURM_EXPORT_ENV".to_owned(), export.to_string());
            env.insert("SLURM_GET_USER_ENV".to_owned(), "1".to_owned());
        }
        for (name, req) in [
            ("SLURM_GPUS", &self.gpus),
            ("SLURM_GPUS_PER_NODE", &self.gpus_per_node),
            ("SLURM_GPUS_PER_TASK", &self.gpus_per_task),
        ] {
            if let Some(r) = req {
                let value = match &r.gpu_type {
                    Some(t) => format!("{t}:{}", r.count),
                    None => r.count.to_string(),
                };
                env.insert(name.to_owned(), value);
            }
        }
        env.into_iter().collect()
    }

    /// Validates the merged options and builds the spec. `script` is the batch script text
    /// (already checked for `#!`), `default_name` the name used without `-J`.
    pub fn to_spec(
        &self,
        script: String,
        argv: Vec<String>,
        default_name: &str,
        ctx: &SubmitContext,
    ) -> Result<JobSpec, OptsError> {
        if self.mem.is_some() && self.mem_per_cpu.is_some() {
            return Err(OptsError::MemConflict);
        }
        if self.requeue && self.no_requeue {
            return Err(OptsError::RequeueConflict);
        }
        let nodes = self.nodes.unwrap_or(NodeRange { min: 0, max: 0 });
        if let Some(ntasks) = self.ntasks
            && nodes.min > ntasks
        {
            return Err(OptsError::NodesOverTasks {
                min: nodes.min,
                ntasks,
            });
        }
        let gpu_type = self.gpu_type()?;
        let begin_time = match &self.begin {
            None => 0,
            Some(b) => {
                let offset = ctx
                    .utc_offset_s
                    .unwrap_or_else(crate::clock::local_utc_offset);
                tandem_sched::time::parse_begin_with_offset(b, ctx.now, offset)
                    .map_err(|e| OptsError::Begin(e.to_string()))?
            }
        };
        let workdir = self.workdir(&ctx.cwd);
        // Relative output paths are relative to the job's working directory, not to wherever
        // the worker happens to run; making them absolute here removes the ambiguity.
        let path_in_workdir = |p: &Option<String>| match p {
            None => String::new(),
            Some(p) if p.is_empty() || Path::new(p).is_absolute() => p.clone(),
            Some(p) => workdir.join(p).to_string_lossy().into_owned(),
        };
        let gpus_per_node = self
            .gpus_per_node
            .as_ref()
            .or(self.gres.as_ref())
            .map_or(0, |g| g.count);
        Ok(JobSpec {
            name: self
                .job_name
                .clone()
                .unwrap_or_else(|| default_name.to_string()),
            script,
            argv,
            workdir: workdir.to_string_lossy().into_owned(),
            environment: self.request_environment(build_environment(
                self.export.as_ref().unwrap_or(&Export::All(Vec::new())),
                &ctx.env,
            )),
            stdout: path_in_workdir(&self.output),
            stderr: path_in_workdir(&self.error),
            partition: self.partition.clone().unwrap_or_default(),
            account: self.account.clone().unwrap_or_default(),
            qos: self.qos.clone().unwrap_or_default(),
            // UNLIMITED and "not given" both travel as 0: the partition's limit applies, and
            // a partition without one is unlimited.
            time_limit_s: self.time.and_then(|t| t.0).unwrap_or(0),
            time_min_s: self.time_min.and_then(|t| t.0).unwrap_or(0),
            nodes_min: nodes.min,
            nodes_max: nodes.max,
            ntasks: self.ntasks.unwrap_or(0),
            ntasks_per_node: self.ntasks_per_node.unwrap_or(0),
            cpus_per_task: self.cpus_per_task.unwrap_or(0),
            mem_per_node_mb: self.mem.unwrap_or(0),
            mem_per_cpu_mb: self.mem_per_cpu.unwrap_or(0),
            gpus: self.gpus.as_ref().map_or(0, |g| g.count),
            gpus_per_node,
            gpus_per_task: self.gpus_per_task.as_ref().map_or(0, |g| g.count),
            gpu_type: gpu_type.unwrap_or_default(),
            array: self.array.clone().unwrap_or_default(),
            dependency: self.dependency.clone().unwrap_or_default(),
            exclusive: self.exclusive.is_some(),
            constraint: self.constraint.clone().unwrap_or_default(),
            hold: self.hold,
            begin_time,
            requeue: self.requeue,
            no_requeue: self.no_requeue,
            submit_host: ctx.hostname.clone(),
            alloc_sid: ctx.sid,
            umask: Some(ctx.umask),
            comment: self.comment.clone().unwrap_or_default(),
            nodelist: self.nodelist.clone().unwrap_or_default(),
            exclude: self.exclude.clone().unwrap_or_default(),
            priority_nice: self.nice.unwrap_or(0),
            signal_number: self.signal.map_or(0, |w| w.number),
            signal_before_s: self.signal.map_or(0, |w| w.before_s),
            signal_batch_only: self.signal.is_some_and(|w| w.batch_only),
            open_mode_append: self.open_mode == Some(OpenMode::Append),
            stdin: path_in_workdir(&self.input),
            ..JobSpec::default()
        })
    }

    /// The one GPU type the job asks for, if any; two different types are an error.
    fn gpu_type(&self) -> Result<Option<String>, OptsError> {
        let mut found: Option<&String> = None;
        for t in [
            &self.gpus,
            &self.gpus_per_node,
            &self.gpus_per_task,
            &self.gres,
        ]
        .into_iter()
        .flatten()
        .filter_map(|g| g.gpu_type.as_ref())
        {
            match found {
                Some(a) if a != t => {
                    return Err(OptsError::GpuTypeConflict {
                        a: a.clone(),
                        b: t.clone(),
                    });
                }
                _ => found = Some(t),
            }
        }
        Ok(found.cloned())
    }
}

/// The job's environment under `--export`.
///
/// `NONE` cannot load the user's login environment on the node as Slurm's `--get-user-env`
/// does; instead the job gets `HOME`, `USER`, `LOGNAME`, `SHELL` from the submitter and a
/// standard `PATH`, which is what a login shell would start from.
pub fn build_environment(export: &Export, env: &[(String, String)]) -> BTreeMap<String, String> {
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let slurm_vars = || {
        env.iter()
            .filter(|(k, _)| k.starts_with("SLURM_"))
            .cloned()
            .collect::<BTreeMap<_, _>>()
    };
    let apply = |out: &mut BTreeMap<String, String>, list: &[(String, Option<String>)]| {
        for (k, v) in list {
            match v {
                Some(v) => {
                    out.insert(k.clone(), v.clone());
                }
                None => {
                    if let Some(v) = lookup(k) {
                        out.insert(k.clone(), v);
                    }
                }
            }
        }
    };
    match export {
        Export::All(extra) => {
            let mut out: BTreeMap<_, _> = env.iter().cloned().collect();
            apply(&mut out, extra);
            out
        }
        Export::Only(list) => {
            let mut out = slurm_vars();
            apply(&mut out, list);
            out
        }
        Export::None => {
            let mut out = slurm_vars();
            for k in ["HOME", "USER", "LOGNAME", "SHELL"] {
                if let Some(v) = lookup(k) {
                    out.insert(k.to_string(), v);
                }
            }
            out.insert(
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            );
            out
        }
    }
}

/// The script `--wrap` generates.
pub fn wrap_script(command: &str) -> String {
    format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n")
}
