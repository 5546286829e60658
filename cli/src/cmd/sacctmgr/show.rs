//! `sacctmgr show account|user|assoc|qos`: the controller's answers as Slurm's tables, with
//! `where` filters and `format=` fields (Slurm's names, optional `%width`).

use anyhow::Context as _;
use tandem_proto::v1;

use super::parse::{Entity, Key, Words, only, values};
use crate::cmd::acct_table::{Column, Layout, render};
use crate::format::table::Align;

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn gpu_tres_cell(v: Option<u32>) -> String {
    v.map(|n| format!("gres/gpu={n}")).unwrap_or_default()
}

type Cell<T> = fn(&T, &Ctx) -> String;

/// What cells need besides their row.
struct Ctx {
    cluster: String,
}

/// A field of a show table: Slurm's header, default width, how to fill it.
struct Field<T> {
    name: &'static str,
    width: usize,
    cell: Cell<T>,
}

impl<T> Field<T> {
    fn new(name: &'static str, width: usize, cell: Cell<T>) -> Self {
        Self { name, width, cell }
    }
}

fn account_fields() -> Vec<Field<v1::AccountInfo>> {
    fn or_name(v: &str, a: &v1::AccountInfo) -> String {
        if v.is_empty() {
            a.name.clone()
        } else {
            v.to_owned()
        }
    }
    vec![
        Field::new("Account", 10, |a, _| a.name.clone()),
        Field::new("Descr", 20, |a, _| or_name(&a.description, a)),
        Field::new("Org", 20, |a, _| or_name(&a.organization, a)),
        Field::new("Parent", 10, |a, _| a.parent.clone()),
        Field::new("Share", 9, |a, _| a.shares.to_string()),
        Field::new("GrpJobs", 7, |a, _| {
            opt(a.limits.as_ref().and_then(|l| l.grp_jobs))
        }),
        Field::new("GrpTRES", 13, |a, _| {
            gpu_tres_cell(a.limits.as_ref().and_then(|l| l.grp_gpus))
        }),
        Field::new("MaxJobs", 7, |a, _| {
            opt(a.limits.as_ref().and_then(|l| l.max_jobs_per_user))
        }),
        Field::new("Cluster", 10, |_, c| c.cluster.clone()),
    ]
}

/// A user with their associations, for `show user`.
struct UserRow {
    user: String,
    default_account: String,
}

fn user_fields() -> Vec<Field<UserRow>> {
    vec![
        Field::new("User", 10, |u, _| u.user.clone()),
        Field::new("Def Acct", 10, |u, _| u.default_account.clone()),
        // Operators are identified by their credentials, not stored per user: root is.
        Field::new("Admin", 9, |u, _| {
            if u.user == "root" {
                "Administrator".into()
            } else {
                "None".into()
            }
        }),
    ]
}

/// One association row: an account (user empty) or a user under an account.
struct AssocRow {
    account: String,
    user: String,
    parent: String,
    shares: u32,
    limits: v1::AssocLimits,
    is_default: bool,
}

fn assoc_fields() -> Vec<Field<AssocRow>> {
    vec![
        Field::new("Cluster", 10, |_, c| c.cluster.clone()),
        Field::new("Account", 10, |a, _| a.account.clone()),
        Field::new("User", 10, |a, _| a.user.clone()),
        Field::new("Partition", 10, |_, _| String::new()),
        Field::new("Share", 9, |a, _| a.shares.to_string()),
        Field::new("GrpJobs", 7, |a, _| opt(a.limits.grp_jobs)),
        Field::new("GrpTRES", 13, |a, _| gpu_tres_cell(a.limits.grp_gpus)),
        Field::new("MaxJobs", 7, |a, _| opt(a.limits.max_jobs_per_user)),
        Field::new("Par Name", 10, |a, _| a.parent.clone()),
        Field::new("Def Acct", 10, |a, _| {
            if a.is_default {
                a.account.clone()
            } else {
                String::new()
            }
        }),
    ]
}

fn qos_fields() -> Vec<Field<v1::QosInfo>> {
    fn lim(q: &v1::QosInfo) -> v1::QosLimits {
        q.limits.unwrap_or_default()
    }
    vec![
        Field::new("Name", 10, |q, _| q.name.clone()),
        Field::new("Priority", 10, |q, _| q.priority.to_string()),
        Field::new("GraceTime", 10, |q, _| {
            tandem_sched::time::format_elapsed(u64::from(q.grace_time_s))
        }),
        Field::new("Preempt", 10, |q, _| q.preempt.join(",")),
        Field::new("PreemptMode", 11, |q, _| q.preempt_mode.clone()),
        Field::new("MaxWall", 11, |q, _| {
            lim(q)
                .max_wall_s
                .map(|s| tandem_sched::time::format_duration(Some(s)))
                .unwrap_or_default()
        }),
        Field::new("MaxTRESPU", 13, |q, _| {
            gpu_tres_cell(lim(q).max_gpus_per_user)
        }),
        Field::new("MaxJobsPU", 9, |q, _| opt(lim(q).max_jobs_per_user)),
        Field::new("MaxSubmitPU", 11, |q, _| opt(lim(q).max_submit_per_user)),
        Field::new("MaxJobsPA", 9, |q, _| opt(lim(q).max_jobs_per_account)),
        Field::new("MaxSubmitPA", 11, |q, _| opt(lim(q).max_submit_per_account)),
    ]
}

/// Picks the `format=` fields (case-insensitive, spaces ignored) or the defaults.
fn pick<'f, T>(
    fields: &'f [Field<T>],
    defaults: &[&str],
    format: &[(String, Option<usize>)],
) -> anyhow::Result<Vec<(&'f Field<T>, usize)>> {
    let norm = |s: &str| s.replace(' ', "").to_ascii_lowercase();
    let want: Vec<(String, Option<usize>)> = if format.is_empty() {
        defaults.iter().map(|d| ((*d).to_owned(), None)).collect()
    } else {
        format.to_vec()
    };
    want.iter()
        .map(|(name, width)| {
            let f = fields
                .iter()
                .find(|f| norm(f.name) == norm(name))
                .with_context(|| {
                    let known: Vec<&str> = fields.iter().map(|f| f.name).collect();
                    format!(
                        "unknown format field {name:?} (known: {})",
                        known.join(", ")
                    )
                })?;
            Ok((f, width.unwrap_or(f.width)))
        })
        .collect()
}

fn table<T>(
    picked: &[(&Field<T>, usize)],
    rows: &[T],
    ctx: &Ctx,
    layout: Layout,
    header: bool,
) -> String {
    let cols: Vec<Column> = picked
        .iter()
        .map(|(f, w)| (f.name.to_owned(), *w, Align::Right))
        .collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| picked.iter().map(|(f, _)| (f.cell)(r, ctx)).collect())
        .collect();
    render(&cols, &cells, layout, header)
}

/// `show ...`: the table for the parsed words from the controller's answers.
pub(super) fn show_table(
    w: &Words,
    assoc: &v1::ListAssociationsResponse,
    qos: &v1::ListQosResponse,
    layout: Layout,
    header: bool,
) -> anyhow::Result<String> {
    let ctx = Ctx {
        cluster: assoc.cluster_name.clone(),
    };
    let name_ok = |n: &str, extra: &[String]| {
        (w.names.is_empty() && extra.is_empty())
            || w.names.iter().any(|x| x == n)
            || extra.iter().any(|x| x == n)
    };
    match w.entity {
        Entity::Account => {
            only(w, &[Key::Cluster, Key::Parent], "a condition", &w.conds)?;
            let parents = values(&w.conds, Key::Parent);
            let fields = account_fields();
            let picked = pick(&fields, &["Account", "Descr", "Org"], &w.format)?;
            let rows: Vec<v1::AccountInfo> = assoc
                .accounts
                .iter()
                .filter(|a| name_ok(&a.name, &[]))
                .filter(|a| parents.is_empty() || parents.contains(&a.parent))
                .cloned()
                .collect();
            Ok(table(&picked, &rows, &ctx, layout, header))
        }
        Entity::User => {
            only(
                w,
                &[Key::Cluster, Key::User, Key::Account, Key::DefaultAccount],
                "a condition",
                &w.conds,
            )?;
            let users = values(&w.conds, Key::User);
            let accounts = values(&w.conds, Key::Account);
            let defaults = values(&w.conds, Key::DefaultAccount);
            let mut rows: Vec<UserRow> = Vec::new();
            for u in &assoc.users {
                if !name_ok(&u.user, &users)
                    || !(accounts.is_empty()
                        || assoc
                            .users
                            .iter()
                            .any(|x| x.user == u.user && accounts.contains(&x.account)))
                {
                    continue;
                }
                if rows.iter().any(|r| r.user == u.user) {
                    continue;
                }
                let default_account = assoc
                    .users
                    .iter()
                    .find(|x| x.user == u.user && x.is_default)
                    .map(|x| x.account.clone())
                    .unwrap_or_default();
                if !defaults.is_empty() && !defaults.contains(&default_account) {
                    continue;
                }
                rows.push(UserRow {
                    user: u.user.clone(),
                    default_account,
                });
            }
            rows.sort_by(|a, b| a.user.cmp(&b.user));
            let fields = user_fields();
            let picked = pick(&fields, &["User", "Def Acct", "Admin"], &w.format)?;
            Ok(table(&picked, &rows, &ctx, layout, header))
        }
        Entity::Assoc => {
            only(
                w,
                &[Key::Cluster, Key::User, Key::Account],
                "a condition",
                &w.conds,
            )?;
            let users = values(&w.conds, Key::User);
            let mut accounts = values(&w.conds, Key::Account);
            accounts.extend(w.names.iter().cloned());
            let mut rows = Vec::new();
            for a in &assoc.accounts {
                if !accounts.is_empty() && !accounts.contains(&a.name) {
                    continue;
                }
                if users.is_empty() {
                    rows.push(AssocRow {
                        account: a.name.clone(),
                        user: String::new(),
                        parent: a.parent.clone(),
                        shares: a.shares,
                        limits: a.limits.unwrap_or_default(),
                        is_default: false,
                    });
                }
                for u in assoc.users.iter().filter(|u| u.account == a.name) {
                    if !users.is_empty() && !users.contains(&u.user) {
                        continue;
                    }
                    rows.push(AssocRow {
                        account: u.account.clone(),
                        user: u.user.clone(),
                        parent: String::new(),
                        shares: u.shares,
                        limits: v1::AssocLimits::default(),
                        is_default: u.is_default,
                    });
                }
            }
            let fields = assoc_fields();
            let picked = pick(
                &fields,
                &[
                    "Cluster",
                    "Account",
                    "User",
                    "Partition",
                    "Share",
                    "GrpJobs",
                    "GrpTRES",
                    "MaxJobs",
                ],
                &w.format,
            )?;
            Ok(table(&picked, &rows, &ctx, layout, header))
        }
        Entity::Qos => {
            only(w, &[], "a condition", &w.conds)?;
            let fields = qos_fields();
            let picked = pick(
                &fields,
                &[
                    "Name",
                    "Priority",
                    "GraceTime",
                    "Preempt",
                    "PreemptMode",
                    "MaxWall",
                    "MaxTRESPU",
                    "MaxJobsPU",
                    "MaxSubmitPU",
                    "MaxJobsPA",
                    "MaxSubmitPA",
                ],
                &w.format,
            )?;
            let rows: Vec<v1::QosInfo> = qos
                .qos
                .iter()
                .filter(|q| name_ok(&q.name, &[]))
                .cloned()
                .collect();
            Ok(table(&picked, &rows, &ctx, layout, header))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::sacctmgr::parse::parse;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn sample() -> v1::ListAssociationsResponse {
        v1::ListAssociationsResponse {
            cluster_name: "tandem".into(),
            accounts: vec![
                v1::AccountInfo {
                    name: "root".into(),
                    shares: 1,
                    ..Default::default()
                },
                v1::AccountInfo {
                    name: "physics".into(),
                    parent: "root".into(),
                    shares: 60,
                    limits: Some(v1::AssocLimits {
                        grp_gpus: Some(16),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            users: vec![v1::UserAssocInfo {
                user: "alice".into(),
                account: "physics".into(),
                shares: 2,
                is_default: true,
            }],
        }
    }

    #[test]
    fn show_tables_parsable_and_fixed() {
        let none = v1::ListQosResponse::default();
        let w = parse(&words("show assoc format=Account,User,Share,GrpTRES")).unwrap();
        let out = show_table(&w, &sample(), &none, Layout::Parsable2, true).unwrap();
        assert_eq!(
            out,
            "Account|User|Share|GrpTRES\nroot||1|\nphysics||60|gres/gpu=16\nphysics|alice|2|\n"
        );
        let w = parse(&words("show user alice")).unwrap();
        let out = show_table(&w, &sample(), &none, Layout::Fixed, true).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[1].starts_with("----------"));
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["alice", "physics", "None"]
        );
        let w = parse(&words("show account format=Account,Bogus")).unwrap();
        assert!(show_table(&w, &sample(), &none, Layout::Fixed, true).is_err());
    }
}
