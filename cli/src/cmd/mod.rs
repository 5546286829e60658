//! One module per command. Each has an `Args` (clap derive; doc comments are the help text)
//! and an async or plain `run(Args) -> Exit`.

pub mod acct_table;
pub mod authd;
pub mod controller;
pub mod demo;
pub mod down;
pub mod links;
pub mod local_cluster;
pub mod local_spool;
pub mod sacct;
pub mod sacctmgr;
pub mod sbatch;
pub mod scancel;
pub mod scontrol;
pub mod sim;
pub mod sinfo;
pub mod sprio;
pub mod squeue;
pub mod srun;
pub mod sshare;
pub mod up;
pub mod worker;

/// A comma-separated list option (`-u alice,bob`), repeated or not.
pub(crate) fn split_commas(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `-u` lists as Slurm's commands take them: names the password database knows, and
/// numeric uids as their names. Returns the names and the entries it does not know, which
/// each command reports in Slurm's words.
pub(crate) fn resolve_users(values: &[String]) -> (Vec<String>, Vec<String>) {
    use nix::unistd::{Uid, User};
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    for u in split_commas(values) {
        let found = match u.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)).ok().flatten(),
            Err(_) => User::from_name(&u).ok().flatten(),
        };
        match found {
            Some(user) => known.push(user.name),
            None => unknown.push(u),
        }
    }
    (known, unknown)
}

/// Job states from `-t`/`--states` lists; `all` means no filter.
pub(crate) fn parse_states(values: &[String]) -> anyhow::Result<Vec<tandem_proto::v1::JobState>> {
    let mut out = Vec::new();
    for s in split_commas(values) {
        if s.eq_ignore_ascii_case("all") {
            return Ok(Vec::new());
        }
        let st = crate::format::view::parse_state(&s)
            .ok_or_else(|| anyhow::anyhow!("Invalid job state specified: {s}"))?;
        out.push(st);
    }
    Ok(out)
}
