//! `sshare`: the Fair Tree numbers of the association tree, as Slurm prints them.
//!
//! Rows come depth-first (root, its accounts, their sub-accounts and users) with the account
//! name indented one space per level. By default the accounts and the caller's own user
//! associations are shown; `-a` shows every user, `-u` chosen users, `-A` chosen accounts.

use clap::Parser;
use serde_json::json;
use tandem_proto::v1;

use super::acct_table::{Column, Layout, render};
use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::table::Align;

/// Show the shares, usage and fair-share factor of each association.
#[derive(Debug, Parser)]
#[command(name = "sshare", version, disable_help_flag = true)]
pub struct Args {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Every user's associations, not only the caller's.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Only these accounts (comma separated).
    #[arg(short = 'A', long = "accounts", value_name = "ACCOUNTS")]
    pub accounts: Vec<String>,
    /// Only these users (comma separated).
    #[arg(short = 'u', long = "users", value_name = "USERS")]
    pub users: Vec<String>,
    /// Also NormUsage and LevelFS.
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// No header line.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// '|'-separated output with a trailing '|'.
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// '|'-separated output without a trailing '|'.
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: Args) -> Exit {
    let accounts = super::split_commas(&args.accounts);
    let users = super::split_commas(&args.users);
    let mut client = Client::connect().await?;
    let resp = client
        .accounting
        .list_shares(v1::ListSharesRequest {})
        .await
        .rpc()?;
    let me = client.identity().user.clone();
    let rows = select(&resp.rows, &accounts, &users, args.all, &me);
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&to_json(&rows))?;
        s.push('\n');
        s
    } else {
        let layout = Layout::from_flags(args.parsable, args.parsable2);
        table(&rows, args.long, layout, !args.noheader)
    };
    crate::emit(&text)?;
    Ok(0)
}

/// The rows to print: accounts (those named with `-A`, else all) and the users `-u`/`-a`
/// ask for (else the caller).
pub fn select<'r>(
    rows: &'r [v1::ShareRow],
    accounts: &[String],
    users: &[String],
    all: bool,
    me: &str,
) -> Vec<&'r v1::ShareRow> {
    rows.iter()
        .filter(|r| accounts.is_empty() || accounts.contains(&r.account))
        .filter(|r| {
            r.user.is_empty()
                || if !users.is_empty() {
                    users.contains(&r.user)
                } else {
                    all || r.user == me
                }
        })
        .collect()
}

fn f6(v: f64) -> String {
    if v.is_infinite() {
        "inf".to_owned()
    } else {
        format!("{v:.6}")
    }
}

/// Slurm's sshare table.
pub fn table(rows: &[&v1::ShareRow], long: bool, layout: Layout, header: bool) -> String {
    let col = |n: &str, w: usize, a: Align| -> Column { (n.to_owned(), w, a) };
    let mut cols = vec![
        col("Account", 20, Align::Left),
        col("User", 10, Align::Right),
        col("RawShares", 10, Align::Right),
        col("NormShares", 11, Align::Right),
        col("RawUsage", 11, Align::Right),
    ];
    if long {
        cols.push(col("NormUsage", 11, Align::Right));
    }
    cols.push(col("EffectvUsage", 13, Align::Right));
    cols.push(col("FairShare", 10, Align::Right));
    if long {
        cols.push(col("LevelFS", 10, Align::Right));
    }
    // Indented from the shallowest row shown: Slurm 22.05's `sshare -n -P -A a1 -A a3`
    // printed `a1||50|...` and ` a1|root|...`, one level less than in the whole tree.
    let base = rows.iter().map(|r| r.depth).min().unwrap_or(0);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let root = r.depth == 0;
            // The root of the tree as Slurm 22.05 prints it: `root|||0.000000|0|1.000000|`,
            // with `-l` no NormUsage: it holds no share of a parent, it is all the usage.
            let mut c = vec![
                format!("{}{}", " ".repeat((r.depth - base) as usize), r.account),
                r.user.clone(),
                if root {
                    String::new()
                } else {
                    r.raw_shares.to_string()
                },
                f6(if root { 0.0 } else { r.norm_shares }),
                format!("{:.0}", r.raw_usage),
            ];
            if long {
                c.push(if root {
                    String::new()
                } else {
                    f6(r.norm_usage)
                });
            }
            c.push(f6(if root { 1.0 } else { r.effective_usage }));
            c.push(r.fairshare.map(f6).unwrap_or_default());
            if long {
                c.push(if root { String::new() } else { f6(r.level_fs) });
            }
            c
        })
        .collect();
    render(&cols, &cells, layout, header)
}

fn to_json(rows: &[&v1::ShareRow]) -> serde_json::Value {
    let finite = |v: f64| if v.is_finite() { json!(v) } else { json!(null) };
    json!({
        "shares": rows
            .iter()
            .map(|r| json!({
                "account": r.account,
                "user": r.user,
                "depth": r.depth,
                "raw_shares": r.raw_shares,
                "norm_shares": r.norm_shares,
                "raw_usage": r.raw_usage,
                "norm_usage": r.norm_usage,
                "effective_usage": r.effective_usage,
                "level_fs": finite(r.level_fs),
                "fairshare": r.fairshare,
            }))
            .collect::<Vec<_>>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(depth: u32, account: &str, user: &str, shares: u32, norm: f64) -> v1::ShareRow {
        v1::ShareRow {
            depth,
            account: account.into(),
            user: user.into(),
            raw_shares: shares,
            norm_shares: norm,
            raw_usage: 0.0,
            norm_usage: 0.0,
            effective_usage: 0.0,
            level_fs: f64::INFINITY,
            fairshare: (!user.is_empty()).then_some(1.0),
        }
    }

    fn tree() -> Vec<v1::ShareRow> {
        vec![
            row(0, "root", "", 1, 1.0),
            row(1, "physics", "", 60, 0.6),
            row(2, "physics", "alice", 1, 0.5),
            row(2, "physics", "bob", 1, 0.5),
            row(1, "chem", "", 40, 0.4),
        ]
    }

    #[test]
    fn default_shows_accounts_and_the_callers_associations() {
        let t = tree();
        let names = |v: Vec<&v1::ShareRow>| -> Vec<String> {
            v.iter()
                .map(|r| format!("{}/{}", r.account, r.user))
                .collect()
        };
        assert_eq!(
            names(select(&t, &[], &[], false, "bob")),
            ["root/", "physics/", "physics/bob", "chem/"]
        );
        assert_eq!(select(&t, &[], &[], true, "bob").len(), 5);
        assert_eq!(
            names(select(
                &t,
                &["physics".into()],
                &["alice".into()],
                false,
                "bob"
            )),
            ["physics/", "physics/alice"]
        );
    }

    #[test]
    fn table_indents_and_formats_like_slurm() {
        let t = tree();
        let rows: Vec<&v1::ShareRow> = t.iter().collect();
        let out = table(&rows, false, Layout::Parsable2, true);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare"
        );
        assert_eq!(lines[1], "root|||0.000000|0|1.000000|");
        assert_eq!(lines[2], " physics||60|0.600000|0|0.000000|");
        assert_eq!(lines[3], "  physics|alice|1|0.500000|0|0.000000|1.000000");
        // `-A physics`: indented from physics, as Slurm's `sshare -A a1` printed `a1||50|...`
        // then ` a1|root|...`.
        let some = select(&t, &["physics".into()], &[], true, "bob");
        let out = table(&some, false, Layout::Parsable2, false);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "physics||60|0.600000|0|0.000000|",
                " physics|alice|1|0.500000|0|0.000000|1.000000",
                " physics|bob|1|0.500000|0|0.000000|1.000000"
            ]
        );
        let long = table(&rows, true, Layout::Fixed, true);
        assert!(long.lines().next().unwrap().contains("LevelFS"));
        // Every fixed column is followed by a space, the last one too, as in Slurm.
        assert!(long.lines().nth(3).unwrap().ends_with("inf "));
    }
}
