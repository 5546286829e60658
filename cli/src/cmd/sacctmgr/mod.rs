//! `sacctmgr`: accounts, user associations and QOS, in Slurm's syntax.
//!
//! ```text
//! sacctmgr [-i] add account physics Parent=science Fairshare=60
//! sacctmgr [-i] add user alice Account=physics[,chem] [DefaultAccount=physics] [Fairshare=2]
//! sacctmgr [-i] add qos high Priority=1000 Preempt=normal PreemptMode=requeue
//! sacctmgr [-i] modify account where Name=physics set Fairshare=70 GrpTRES=gres/gpu=16
//! sacctmgr [-i] modify user where Name=alice Account=physics set Fairshare=5
//! sacctmgr [-i] modify qos where Name=high set MaxJobsPerUser=4 MaxWall=1-00:00:00
//! sacctmgr [-i] delete account|user|qos NAME [where Account=A]
//! sacctmgr [-nPp] show account|user|assoc|qos [NAME] [where ...] [format=F1,F2%20]
//! ```
//!
//! Words are parsed (pure, [`parse`]) and checked before anything is sent; the controller
//! validates again and applies a request whole or not at all. Limits take `-1` to clear.
//!
//! Confirmation: Slurm asks "commit changes?" unless `-i`. Tandem asks only when stdin is a
//! terminal and `-i` was not given; a script (stdin not a terminal) gets the change applied,
//! as with `-i`, because there is nobody to answer and a silent "no" would surprise more.
//!
//! Layout: [`parse`] (words -> requests, pure), `show` (tables), this file (flags, confirm,
//! RPCs).

mod parse;
mod show;

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::bail;
use clap::Parser;
use tandem_proto::v1;

pub use parse::{Action, ChangeRequest, Entity, Key, Words, change_request, parse};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::cmd::acct_table::Layout;

/// View and change accounts, users (associations) and QOS.
#[derive(Debug, Parser)]
#[command(name = "sacctmgr", version, disable_help_flag = true)]
pub struct Args {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Commit changes without asking (Tandem asks only when stdin is a terminal).
    #[arg(short = 'i', long = "immediate")]
    pub immediate: bool,
    /// No header line.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// '|'-separated output with a trailing '|'.
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// '|'-separated output without a trailing '|'.
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Print only errors.
    #[arg(short = 'Q', long = "quiet")]
    pub quiet: bool,
    /// COMMAND ENTITY [NAME...] [where KEY=VALUE...] [set KEY=VALUE...]
    #[arg(
        value_name = "WORDS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub words: Vec<String>,
}

impl ChangeRequest {
    /// The line above the change: before the question, and over what the controller did.
    fn headline(&self) -> &'static str {
        match self {
            ChangeRequest::AddAccount(_) => "Adding Account(s)",
            ChangeRequest::ModifyAccount(_) => "Modified account associations...",
            ChangeRequest::DeleteAccount(_) => "Deleting account(s)...",
            ChangeRequest::AddUser(_) => "Adding User(s)",
            ChangeRequest::ModifyUser(_) => "Modified user associations...",
            ChangeRequest::DeleteUser(_) => "Deleting user associations...",
            ChangeRequest::AddQos(_) => "Adding QOS(s)",
            ChangeRequest::ModifyQos(_) => "Modified qos...",
            ChangeRequest::DeleteQos(_) => "Deleting QOS(s)...",
        }
    }

    async fn send(self, client: &mut Client) -> anyhow::Result<v1::AccountingChangeResponse> {
        let a = &mut client.accounting;
        match self {
            ChangeRequest::AddAccount(r) => a.add_account(r).await.rpc(),
            ChangeRequest::ModifyAccount(r) => a.modify_account(r).await.rpc(),
            ChangeRequest::DeleteAccount(r) => a.delete_account(r).await.rpc(),
            ChangeRequest::AddUser(r) => a.add_user(r).await.rpc(),
            ChangeRequest::ModifyUser(r) => a.modify_user(r).await.rpc(),
            ChangeRequest::DeleteUser(r) => a.delete_user(r).await.rpc(),
            ChangeRequest::AddQos(r) => a.add_qos(r).await.rpc(),
            ChangeRequest::ModifyQos(r) => a.modify_qos(r).await.rpc(),
            ChangeRequest::DeleteQos(r) => a.delete_qos(r).await.rpc(),
        }
    }
}

// === run ===

/// Slurm's sacctmgr takes its flags anywhere on the line (`show assoc -P`): flags among the
/// words move to `args`; anything else starting with `-` is an error.
fn hoist_flags(mut args: Args) -> anyhow::Result<Args> {
    let mut words = Vec::with_capacity(args.words.len());
    for w in std::mem::take(&mut args.words) {
        match w.as_str() {
            "-i" | "--immediate" => args.immediate = true,
            "-n" | "--noheader" => args.noheader = true,
            "-p" | "--parsable" => args.parsable = true,
            "-P" | "--parsable2" => args.parsable2 = true,
            "-Q" | "--quiet" => args.quiet = true,
            f if f.starts_with('-') => bail!("unknown option {f:?}"),
            _ => words.push(w),
        }
    }
    args.words = words;
    Ok(args)
}

pub async fn run(args: Args) -> Exit {
    let args = hoist_flags(args)?;
    let w = parse(&args.words)?;
    let layout = Layout::from_flags(args.parsable, args.parsable2);
    if w.action == Action::Show {
        let mut client = Client::connect().await?;
        let assoc = client
            .accounting
            .list_associations(v1::ListAssociationsRequest {})
            .await
            .rpc()?;
        let qos = if w.entity == Entity::Qos {
            client
                .accounting
                .list_qos(v1::ListQosRequest {})
                .await
                .rpc()?
        } else {
            v1::ListQosResponse::default()
        };
        crate::emit(&show::show_table(&w, &assoc, &qos, layout, !args.noheader)?)?;
        return Ok(0);
    }
    let req = change_request(&w)?;
    let headline = req.headline();
    if !args.immediate && std::io::stdin().is_terminal() {
        println!(" {headline}");
        for n in &w.names {
            println!("  {n}");
        }
        if !confirm()? {
            println!(" Changes Discarded");
            return Ok(0);
        }
    }
    let mut client = Client::connect().await?;
    let resp = req.send(&mut client).await?;
    if !args.quiet {
        // What the controller did: the names it resolved (`delete user alice` names each
        // association it removed).
        let mut out = format!(" {headline}\n");
        for line in &resp.changed {
            out.push_str(&format!("  {line}\n"));
        }
        crate::emit(&out)?;
    }
    Ok(0)
}

/// Slurm's question; anything but y/yes is no.
fn confirm() -> anyhow::Result<bool> {
    print!("Would you like to commit changes? (N/y): ");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_may_follow_the_words() {
        let args = Args::try_parse_from(["sacctmgr", "show", "assoc", "-P", "-n"]).unwrap();
        let args = hoist_flags(args).unwrap();
        assert!(args.parsable2 && args.noheader);
        assert_eq!(args.words, ["show", "assoc"]);
        let args = Args::try_parse_from(["sacctmgr", "-i", "add", "qos", "q", "-x"]).unwrap();
        assert!(hoist_flags(args).is_err());
    }
}
