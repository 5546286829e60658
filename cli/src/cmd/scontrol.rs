//! `scontrol`: show jobs, nodes and partitions; expand host lists; hold, release, requeue and
//! update jobs; drain and resume nodes.
//!
//! The words follow Slurm's grammar (`show job 12`, `update JobId=12 TimeLimit=30`), parsed
//! here by hand: clap has no notion of `Key=Value` lists. Entity names and keys are
//! case-insensitive, as in Slurm.

use anyhow::{Context as _, bail};
use clap::Parser;
use tandem_proto::v1::{
    JobUpdate, ListJobsRequest, ListNodesRequest, ListPartitionsRequest, UpdateJobRequest,
    UpdateNodeRequest, update_job_request::Action,
};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::view::{JobView, NodeView, PartitionView};
use crate::format::{Human, Json, Output};

/// Show and change jobs, nodes and partitions.
#[derive(Debug, Parser)]
#[command(name = "scontrol", version, infer_long_args = true)]
pub struct Args {
    /// Print JSON (show only).
    #[arg(long)]
    pub json: bool,
    /// show job|node|partition [ID], show hostnames [LIST], show hostlist LIST,
    /// hold|release|requeue JOB..., update JobId=ID Key=Value..., update NodeName=LIST State=...
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub words: Vec<String>,
}

/// What the words ask for, parsed before any RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    ShowJobs(Option<String>),
    ShowNodes(Option<String>),
    ShowPartitions(Option<String>),
    Hostnames(String),
    Hostlist(String),
    Hold(Vec<String>),
    Release(Vec<String>),
    Requeue(Vec<String>),
    UpdateJob {
        job: String,
        update: JobUpdate,
    },
    UpdateNode {
        nodes: String,
        state: String,
        reason: String,
    },
    Ping,
}

fn is(word: &str, full: &str, min: usize) -> bool {
    // Slurm accepts unique prefixes of its keywords.
    let w = word.to_ascii_lowercase();
    w.len() >= min && full.starts_with(&w)
}

/// Parses scontrol's words. `env_nodelist` is `$SLURM_JOB_NODELIST` (show hostnames default).
pub fn parse(words: &[String], env_nodelist: Option<String>) -> anyhow::Result<Request> {
    let Some(first) = words.first() else {
        bail!("no command given");
    };
    let rest = &words[1..];
    let one = |what: &str| -> anyhow::Result<Option<String>> {
        match rest.get(1..).unwrap_or_default() {
            [] => Ok(None),
            [id] => Ok(Some(id.clone())),
            _ => bail!("too many arguments for show {what}"),
        }
    };
    if is(first, "show", 2) {
        let Some(entity) = rest.first() else {
            bail!("show needs an entity: job, node, partition, hostnames, hostlist");
        };
        // One "name=id" word (show job=12) is accepted too.
        if let Some((ent, id)) = entity.split_once('=') {
            let words: Vec<String> = vec![first.clone(), ent.to_string(), id.to_string()];
            return parse(&words, env_nodelist);
        }
        return Ok(if is(entity, "jobs", 1) {
            Request::ShowJobs(one("job")?)
        } else if is(entity, "nodes", 1) {
            Request::ShowNodes(one("node")?)
        } else if is(entity, "partitions", 1) {
            Request::ShowPartitions(one("partition")?)
        } else if is(entity, "hostnames", 5) {
            let list = one("hostnames")?.or(env_nodelist).ok_or_else(|| {
                anyhow::anyhow!("show hostnames needs a host list (or SLURM_JOB_NODELIST)")
            })?;
            Request::Hostnames(list)
        } else if is(entity, "hostlist", 5) {
            let list = rest.get(1..).unwrap_or_default().join(",");
            if list.is_empty() {
                bail!("show hostlist needs host names");
            }
            Request::Hostlist(list)
        } else {
            bail!("invalid entity {entity:?} for show");
        });
    }
    let ids = || -> anyhow::Result<Vec<String>> {
        let ids: Vec<String> = rest
            .iter()
            .map(|w| w.split_once('=').map_or(w.as_str(), |(_, v)| v).to_string())
            .collect();
        if ids.is_empty() {
            bail!("{first} needs a job id");
        }
        for i in &ids {
            crate::jobref::parse_list(i).map_err(anyhow::Error::msg)?;
        }
        Ok(ids)
    };
    if is(first, "hold", 2) || is(first, "uhold", 2) {
        return Ok(Request::Hold(ids()?));
    }
    if is(first, "release", 3) {
        return Ok(Request::Release(ids()?));
    }
    if is(first, "requeue", 3) {
        return Ok(Request::Requeue(ids()?));
    }
    if is(first, "update", 2) {
        return parse_update(rest);
    }
    if is(first, "ping", 2) {
        return Ok(Request::Ping);
    }
    bail!("invalid command {first:?}")
}

fn parse_update(words: &[String]) -> anyhow::Result<Request> {
    let mut pairs = Vec::new();
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("update expects Key=Value, got {w:?}"))?;
        pairs.push((k.to_ascii_lowercase(), v.to_string()));
    }
    let Some((first_key, target)) = pairs.first().cloned() else {
        bail!("update needs JobId=ID or NodeName=LIST");
    };
    // Slurm takes every word in turn, so a key given twice keeps its last value; the target
    // key too (`update NodeName=n7 NodeName=n8 State=DRAIN` drained only n8 on Slurm 22.05,
    // `update JobId=15 JobId=16 TimeLimit=7` changed only 16).
    if first_key == "nodename" || first_key == "node" {
        let mut target = target;
        let mut state = String::new();
        let mut reason = String::new();
        for (k, v) in &pairs[1..] {
            match k.as_str() {
                "nodename" | "node" => target = v.clone(),
                "state" => state = v.to_ascii_uppercase(),
                "reason" => reason = v.clone(),
                _ => bail!("update of nodes does not know {k:?}"),
            }
        }
        if !matches!(state.as_str(), "DRAIN" | "RESUME" | "DOWN" | "UNDRAIN") {
            bail!("node State must be DRAIN, RESUME, DOWN or UNDRAIN");
        }
        tandem_sched::hostlist::expand(&target)?;
        return Ok(Request::UpdateNode {
            nodes: target,
            state,
            reason,
        });
    }
    if first_key != "jobid" && first_key != "job" {
        bail!("update needs JobId=ID or NodeName=LIST first");
    }
    let mut target = target;
    let mut update = JobUpdate::default();
    for (k, v) in &pairs[1..] {
        match k.as_str() {
            "jobid" | "job" => target = v.clone(),
            "timelimit" => {
                let t = tandem_sched::time::parse_duration(v)
                    .with_context(|| format!("invalid TimeLimit={v}"))?;
                update.time_limit_s = Some(t.unwrap_or(0));
            }
            "partition" => update.partition = Some(v.clone()),
            "name" | "jobname" => update.name = Some(v.clone()),
            "account" => update.account = Some(v.clone()),
            "qos" => update.qos = Some(v.clone()),
            "nice" => {
                update.nice = Some(v.parse().map_err(|_| anyhow::anyhow!("invalid Nice={v}"))?)
            }
            "dependency" => update.dependency = Some(v.clone()),
            "comment" => update.comment = Some(v.clone()),
            "priority" => {
                update.priority = Some(
                    v.parse()
                        .map_err(|_| anyhow::anyhow!("invalid Priority={v}"))?,
                )
            }
            _ => bail!("update of jobs does not know {k:?}"),
        }
    }
    crate::jobref::parse(&target).map_err(anyhow::Error::msg)?;
    Ok(Request::UpdateJob {
        job: target,
        update,
    })
}

/// `--json` among the words (`scontrol show job 12 --json`): Slurm's option parser takes
/// options anywhere, and clap's trailing words would swallow it. Returns the flag and the
/// other words.
fn take_json(words: &[String]) -> (bool, Vec<String>) {
    let rest: Vec<String> = words.iter().filter(|w| *w != "--json").cloned().collect();
    (rest.len() != words.len(), rest)
}

/// `scontrol ping`, in Slurm's words: `Slurmctld(primary) at HOST is UP` (exit 0) or `is
/// DOWN` (exit 1) when the controller does not answer a listing. Tandem has no backup
/// controller to report.
async fn ping() -> Exit {
    let ep = tandem_net::endpoint::discover()?;
    let host = controller_host(&ep.controller);
    let up = match Client::connect().await {
        Ok(mut client) => client
            .nodes
            .list_partitions(tandem_proto::v1::ListPartitionsRequest {})
            .await
            .is_ok(),
        Err(_) => false,
    };
    println!(
        "Slurmctld(primary) at {host} is {}",
        if up { "UP" } else { "DOWN" }
    );
    Ok(u8::from(!up))
}

/// The host of a controller address (`https://ctl.example:6817` -> `ctl.example`).
fn controller_host(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

pub async fn run(args: Args) -> Exit {
    let (json_word, words) = take_json(&args.words);
    let req = parse(&words, std::env::var("SLURM_JOB_NODELIST").ok())?;
    let output: Box<dyn Output> = if args.json || json_word {
        Box::new(Json)
    } else {
        Box::new(Human::new(None, true))
    };
    // Host lists need no cluster.
    match &req {
        Request::Hostnames(list) => {
            let mut text = tandem_sched::hostlist::expand(list)?.join("\n");
            text.push('\n');
            crate::emit(&text)?;
            return Ok(0);
        }
        Request::Hostlist(list) => {
            let names = tandem_sched::hostlist::expand(list)?;
            crate::emit(&format!("{}\n", tandem_sched::hostlist::compress(&names)))?;
            return Ok(0);
        }
        Request::Ping => return ping().await,
        // Slurm's scontrol refuses this itself, in these words and without its name.
        Request::UpdateNode { state, reason, .. }
            if reason.trim().is_empty() && matches!(state.as_str(), "DRAIN" | "DOWN") =>
        {
            eprintln!("You must specify a reason when DOWNING or DRAINING a node. Request denied");
            return Ok(1);
        }
        _ => {}
    }
    let mut client = Client::connect().await?;
    match req {
        Request::ShowJobs(id) => {
            let jobs = match &id {
                Some(id) => crate::jobref::parse_list(id).map_err(anyhow::Error::msg)?,
                None => Vec::new(),
            };
            let resp = client
                .jobs
                .list_jobs(ListJobsRequest {
                    jobs,
                    include_finished: true,
                    fold_arrays: false,
                    ..ListJobsRequest::default()
                })
                .await
                .rpc()?;
            if resp.jobs.is_empty() {
                match id {
                    Some(id) => bail!("Invalid job id specified: {id}"),
                    None => {
                        println!("No jobs in the system");
                        return Ok(0);
                    }
                }
            }
            let views: Vec<JobView> = resp
                .jobs
                .iter()
                .map(|j| JobView::from_job(j, resp.now))
                .collect();
            crate::emit(&output.job_details(&views))?;
        }
        Request::ShowNodes(name) => {
            let resp = client
                .nodes
                .list_nodes(ListNodesRequest {
                    nodes: name.clone().unwrap_or_default(),
                    partition: String::new(),
                })
                .await
                .rpc()?;
            if resp.nodes.is_empty()
                && let Some(n) = name
            {
                bail!("Node {n} not found");
            }
            let views: Vec<NodeView> = resp.nodes.iter().map(NodeView::from_node).collect();
            crate::emit(&output.node_details(&views))?;
        }
        Request::ShowPartitions(name) => {
            let resp = client
                .nodes
                .list_partitions(ListPartitionsRequest {})
                .await
                .rpc()?;
            let views: Vec<PartitionView> = resp
                .partitions
                .iter()
                .filter(|p| name.as_ref().is_none_or(|n| *n == p.name))
                .map(PartitionView::from_partition)
                .collect();
            if views.is_empty()
                && let Some(n) = name
            {
                bail!("Partition {n} not found");
            }
            crate::emit(&output.partition_details(&views))?;
        }
        Request::Hold(ids) => job_action(&mut client, &ids, Action::Hold(true)).await?,
        Request::Release(ids) => job_action(&mut client, &ids, Action::Release(true)).await?,
        Request::Requeue(ids) => job_action(&mut client, &ids, Action::Requeue(true)).await?,
        Request::UpdateJob { job, update } => {
            job_action(&mut client, &[job], Action::Update(update)).await?
        }
        Request::UpdateNode {
            nodes,
            state,
            reason,
        } => {
            client
                .nodes
                .update_node(UpdateNodeRequest {
                    nodes,
                    state,
                    reason,
                })
                .await
                .rpc()?;
        }
        Request::Hostnames(_) | Request::Hostlist(_) | Request::Ping => {}
    }
    Ok(0)
}

async fn job_action(client: &mut Client, ids: &[String], action: Action) -> anyhow::Result<()> {
    for id in ids {
        for job in crate::jobref::parse_list(id).map_err(anyhow::Error::msg)? {
            client
                .jobs
                .update_job(UpdateJobRequest {
                    job: Some(job),
                    action: Some(action.clone()),
                })
                .await
                .rpc()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn ping_names_the_controllers_host() {
        assert_eq!(controller_host("https://ctl.example:6817"), "ctl.example");
        assert_eq!(controller_host("http://127.0.0.1:1"), "127.0.0.1");
        assert_eq!(controller_host("https://[::1]:6817/"), "::1");
        assert_eq!(controller_host("ctl"), "ctl");
        assert_eq!(parse(&["ping".into()], None).unwrap(), Request::Ping);
    }

    #[test]
    fn json_may_follow_the_words() {
        let (json, rest) = take_json(&w("show partition --json"));
        assert!(json);
        assert_eq!(parse(&rest, None).unwrap(), Request::ShowPartitions(None));
        let (json, rest) = take_json(&w("show job 12"));
        assert!(!json);
        assert_eq!(rest, w("show job 12"));
    }

    #[test]
    fn grammar() {
        assert_eq!(
            parse(&w("show job 12"), None).unwrap(),
            Request::ShowJobs(Some("12".into()))
        );
        assert_eq!(
            parse(&w("show jobs"), None).unwrap(),
            Request::ShowJobs(None)
        );
        assert_eq!(
            parse(&w("sh job=7"), None).unwrap(),
            Request::ShowJobs(Some("7".into()))
        );
        assert_eq!(
            parse(&w("show node node-1"), None).unwrap(),
            Request::ShowNodes(Some("node-1".into()))
        );
        assert_eq!(
            parse(&w("show partition"), None).unwrap(),
            Request::ShowPartitions(None)
        );
        assert_eq!(
            parse(&w("show hostnames"), Some("n[1-2]".into())).unwrap(),
            Request::Hostnames("n[1-2]".into())
        );
        assert_eq!(
            parse(&w("hold 3 4_[1-2]"), None).unwrap(),
            Request::Hold(vec!["3".into(), "4_[1-2]".into()])
        );
        assert_eq!(
            parse(&w("release jobid=3"), None).unwrap(),
            Request::Release(vec!["3".into()])
        );
        match parse(&w("update JobId=5 TimeLimit=30 Partition=gpu"), None).unwrap() {
            Request::UpdateJob { job, update } => {
                assert_eq!(job, "5");
                assert_eq!(update.time_limit_s, Some(1800));
                assert_eq!(update.partition.as_deref(), Some("gpu"));
                assert_eq!(update.name, None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(
                &w("update NodeName=node-[1-2] State=drain Reason=maint"),
                None
            )
            .unwrap(),
            Request::UpdateNode {
                nodes: "node-[1-2]".into(),
                state: "DRAIN".into(),
                reason: "maint".into()
            }
        );
    }

    /// Slurm 22.05: `scontrol update JobId=15 TimeLimit=5 TimeLimit=10` set 00:10:00,
    /// `JobName=x JobName=y` named it y, `JobId=15 JobId=16 TimeLimit=7` changed only 16;
    /// `update NodeName=n7 NodeName=n8 State=DRAIN Reason=x Reason=why` drained n8 for
    /// "why", and `State=DRAIN State=RESUME` resumed.
    #[test]
    fn a_key_given_twice_keeps_its_last_value() {
        match parse(
            &w("update JobId=15 JobId=16 TimeLimit=5 TimeLimit=10 JobName=x JobName=y"),
            None,
        )
        .unwrap()
        {
            Request::UpdateJob { job, update } => {
                assert_eq!(job, "16");
                assert_eq!(update.time_limit_s, Some(600));
                assert_eq!(update.name.as_deref(), Some("y"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(
                &w("update NodeName=n7 NodeName=n8 State=DRAIN State=RESUME Reason=x Reason=why"),
                None
            )
            .unwrap(),
            Request::UpdateNode {
                nodes: "n8".into(),
                state: "RESUME".into(),
                reason: "why".into()
            }
        );
        assert!(parse(&w("update JobId=5 JobId=x TimeLimit=1"), None).is_err());
    }

    #[test]
    fn bad_words() {
        for bad in [
            "show",
            "show widgets",
            "show hostnames",
            "hold",
            "hold x",
            "update JobId=5 TimeLimit=-3",
            "update JobId=5 Bogus=1",
            "update TimeLimit=3",
            "update NodeName=n1 State=sideways",
            "frobnicate",
        ] {
            assert!(parse(&w(bad), None).is_err(), "{bad}");
        }
    }
}
