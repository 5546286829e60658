//! Packaging: the Helm charts and the Dockerfile, checked without a cluster or docker.
//!
//! - `charts_render_lint_and_validate` runs `scripts/chart-tests` (real Helm through
//!   helm-python-sdk, `kubernetes-validate --strict`, the CRD schemas, values.schema.json;
//!   it makes its Python environment under `target/` the first time), then checks every
//!   command the rendered containers run against the built binaries: the subcommand exists
//!   and knows every `--flag` the chart passes.
//! - The Dockerfile builds and copies only binaries of the workspace, its links are the
//!   names `tandem links` makes, and it runs as a non-root user.
//! - The documentation: every relative link in the repository's Markdown files resolves to a
//!   file or folder, and every `#anchor` into a Markdown file to one of its headings
//!   (GitHub's slugs); `README.md` stays under 250 lines.
//!
//! The chart and Dockerfile tests need the binaries built first: `cargo build --bins -p
//! tandem-cli -p tandem-operator -p tandem-bridge` (the README's test command builds every
//! binary).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// `target/<profile>/`, where the workspace's binaries are built.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/packaging-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --bins -p tandem-cli -p tandem-operator -p tandem-bridge` first",
        p.display()
    );
    p
}

fn dockerfile() -> String {
    std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile at the repository root")
}

/// The Dockerfile's instructions with `\` continuations joined.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    out
}

/// (package name, its binary target names) of every workspace member, from `cargo metadata`.
fn workspace_bins() -> Vec<(String, Vec<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let bins = p["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .filter(|t| {
                    t["kind"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "bin"))
                })
                .map(|t| t["name"].as_str().expect("target name").to_owned())
                .collect();
            (p["name"].as_str().expect("package name").to_owned(), bins)
        })
        .collect()
}

/// The words after each `-p` in the builder's `cargo build`.
fn built_packages(instrs: &[String]) -> Vec<String> {
    let build = instrs
        .iter()
        .find(|i| i.starts_with("RUN") && i.contains("cargo build"))
        .expect("a RUN cargo build in the Dockerfile");
    // Only the cargo command itself (`mkdir -p` may follow in the same RUN).
    let cargo = build
        .split("cargo build")
        .nth(1)
        .and_then(|rest| rest.split("&&").next())
        .unwrap_or_default();
    let words: Vec<&str> = cargo.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "-p" || w[0] == "--package")
        .map(|w| w[1].to_owned())
        .collect()
}

/// Files the runtime stage copies from the builder into `/usr/local/bin/`.
fn copied_binaries(instrs: &[String]) -> Vec<String> {
    instrs
        .iter()
        .filter(|i| i.starts_with("COPY --from=builder"))
        .filter_map(|i| i.split_whitespace().last())
        .filter_map(|dest| dest.strip_prefix("/usr/local/bin/"))
        .map(str::to_owned)
        .collect()
}

/// The target and the names of the `for name in ...; do ln -s TARGET "$name"` loop.
fn linked_names(instrs: &[String]) -> (String, BTreeSet<String>) {
    let run = instrs
        .iter()
        .find(|i| i.contains("ln -s tandem"))
        .expect("the Dockerfile links the CLI names to a tandem binary");
    let list = run
        .split("for name in ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("a `for name in ...;` loop");
    let target = run
        .split("ln -s ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("ln -s TARGET");
    (
        target.to_owned(),
        list.split_whitespace().map(str::to_owned).collect(),
    )
}

#[test]
fn the_dockerfile_builds_and_copies_workspace_binaries() {
    let instrs = instructions(&dockerfile());
    let bins = workspace_bins();
    let packages = built_packages(&instrs);
    assert!(!packages.is_empty(), "cargo build names no package (-p)");
    let mut buildable = BTreeSet::new();
    for p in &packages {
        let (_, b) = bins
            .iter()
            .find(|(name, _)| name == p)
            .unwrap_or_else(|| panic!("the Dockerfile builds {p}, not a workspace package"));
        buildable.extend(b.iter().cloned());
    }
    let copied = copied_binaries(&instrs);
    for want in ["tandem", "tandem-slurm", "tandem-operator", "tandem-bridge"] {
        assert!(
            copied.iter().any(|c| c == want),
            "the image lacks {want}: {copied:?}"
        );
    }
    for c in &copied {
        assert!(
            buildable.contains(c),
            "the Dockerfile copies {c}, which no built package ({packages:?}) has as a binary ({buildable:?})"
        );
        let cp = instrs
            .iter()
            .find(|i| i.contains("cargo build"))
            .expect("cargo build");
        assert!(
            cp.contains(&format!("target/release/{c}")),
            "the builder does not take {c} out of target/release"
        );
    }
    // Non-root, by number (PodSecurity's runAsNonRoot can only check a numeric user).
    let user = instrs
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("USER "))
        .expect("a USER instruction");
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.trim().parse().ok())
        .unwrap_or_else(|| panic!("USER {user} is not numeric"));
    assert_ne!(uid, 0, "the image runs as root");
    for chart in ["tandem-operator", "tandem-bridge"] {
        let values =
            std::fs::read_to_string(root().join(format!("charts/{chart}/values.yaml"))).unwrap();
        let v: serde_yaml::Value = serde_yaml::from_str(&values).unwrap();
        assert_eq!(
            v["podSecurityContext"]["runAsUser"].as_u64(),
            Some(u64::from(uid)),
            "{chart}'s runAsUser differs from the image's USER"
        );
    }
    // Multi-stage: the runtime stage is not the Rust image.
    let froms: Vec<&String> = instrs.iter().filter(|i| i.starts_with("FROM ")).collect();
    assert!(froms.len() >= 2, "not multi-stage: {froms:?}");
    assert!(
        !froms.last().unwrap().contains("rust"),
        "the runtime stage is the Rust image"
    );
    let entry = instrs
        .iter()
        .find_map(|i| i.strip_prefix("ENTRYPOINT "))
        .expect("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry).expect("ENTRYPOINT in exec form");
    assert!(
        copied.contains(&entry[0]),
        "ENTRYPOINT {entry:?} is not a copied binary"
    );
    assert!(
        instrs
            .iter()
            .any(|i| i.contains("apt-get install") && i.contains(" python3 ")),
        "python3 is not in the runtime image"
    );
}

#[test]
fn the_dockerfile_links_the_names_tandem_links_makes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(built("tandem"))
        .arg("links")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "tandem links: {out:?}");
    let made: BTreeSet<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        made.contains("sbatch") && made.contains("squeue"),
        "{made:?}"
    );
    let target = std::fs::read_link(dir.path().join("sbatch")).unwrap();
    assert_eq!(
        target.file_name().and_then(|n| n.to_str()),
        Some("tandem-slurm"),
        "`tandem links` links to tandem-slurm when it is built beside tandem"
    );
    let (linked_to, linked) = linked_names(&instructions(&dockerfile()));
    assert_eq!(
        linked, made,
        "the Dockerfile's links differ from `tandem links`"
    );
    assert_eq!(
        linked_to, "tandem-slurm",
        "the Dockerfile links to {linked_to}"
    );
}

/// Runs `bin subcommand --help`; returns its output.
fn help(bin: &str, sub: &[&str]) -> String {
    let out = Command::new(built(bin))
        .args(sub)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{bin} {} --help` fails: {}",
        sub.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The command line a container runs is one the binary accepts: its subcommand exists and
/// every long flag appears in that subcommand's help.
fn assert_accepted(where_: &str, argv: &[String]) {
    let bin = argv.first().map(String::as_str).unwrap_or("tandem");
    assert!(
        ["tandem", "tandem-operator", "tandem-bridge"].contains(&bin),
        "{where_}: runs {bin}, which the image does not have"
    );
    let sub = argv
        .get(1)
        .filter(|a| !a.starts_with('-'))
        .unwrap_or_else(|| panic!("{where_}: {argv:?} names no subcommand"));
    let text = help(bin, &[sub]);
    for flag in argv.iter().filter(|a| a.starts_with("--")) {
        let name = flag.split('=').next().unwrap();
        assert!(
            text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
                .any(|w| w == name),
            "{where_}: `{bin} {sub}` has no flag {name}"
        );
    }
}

#[test]
fn charts_render_lint_and_validate() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root().join("scripts/chart-tests"))
        .env("CHART_TESTS_OUT", out_dir.path())
        .output()
        .expect("bash runs scripts/chart-tests");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "scripts/chart-tests failed:\n{stdout}"
    );
    assert!(stdout.contains(" 0 failed"), "no summary line:\n{stdout}");

    let text = std::fs::read_to_string(out_dir.path().join("entrypoints.json"))
        .expect("chart tests write entrypoints.json");
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    let mut seen = BTreeSet::new();
    for e in &entries {
        let mut argv: Vec<String> = Vec::new();
        for part in ["command", "args"] {
            for a in e[part].as_array().expect("list") {
                argv.push(a.as_str().expect("string").to_owned());
            }
        }
        if seen.insert(argv.clone()) {
            assert_accepted(e["where"].as_str().unwrap_or("?"), &argv);
        }
    }
    let subs: BTreeSet<String> = seen
        .iter()
        .filter_map(|a| Some(format!("{} {}", a.first()?, a.get(1)?)))
        .collect();
    for want in [
        "tandem-operator run",
        "tandem-bridge run",
        "tandem-bridge webhook-certs",
    ] {
        assert!(subs.contains(want), "no chart runs `{want}`: {subs:?}");
    }
}

/// The pods the operator renders (operator/src/render.rs) run these subcommands of the
/// image's `tandem`.
#[test]
fn the_operators_pod_commands_exist() {
    for sub in ["controller", "worker", "authd"] {
        help("tandem", &[sub]);
    }
}

/// (role kind, its namespace, API group, resource, verb): one grant.
type Grant = (String, String, String, String, String);

/// What the operator chart's roles grant its service account, rendered by real Helm with
/// `values`, as [`Grant`]s. Only roles bound to the chart's service account count.
fn operator_chart_grants(values: serde_json::Value) -> BTreeSet<Grant> {
    use tandem_e2e::story::helm;
    let python = helm::python().unwrap_or_else(|e| panic!("the chart venv: {e:#}"));
    let rendered = helm::render(
        &python,
        "tandem-operator",
        "tandem-operator",
        "tandem-system",
        &values,
    )
    .unwrap_or_else(|e| panic!("helm render: {e:#}"));
    let objs: Vec<serde_json::Value> = rendered
        .objects
        .iter()
        .map(|o| serde_json::to_value(o).expect("objects serialize"))
        .collect();
    let kind = |o: &serde_json::Value| o["kind"].as_str().unwrap_or_default().to_owned();
    let ns = |o: &serde_json::Value| {
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let sa = objs
        .iter()
        .find(|o| kind(o) == "ServiceAccount")
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .expect("the chart makes a ServiceAccount");
    // (role kind, namespace, name) of every role bound to the service account.
    let mut bound = BTreeSet::new();
    for b in objs
        .iter()
        .filter(|o| ["ClusterRoleBinding", "RoleBinding"].contains(&kind(o).as_str()))
    {
        let to_sa = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == sa.as_str()
                && s["namespace"] == "tandem-system"
        });
        if to_sa {
            let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default().to_owned();
            // A RoleBinding grants in its own namespace; a ClusterRoleBinding everywhere.
            let where_ = if kind(b) == "RoleBinding" {
                ns(b)
            } else {
                String::new()
            };
            bound.insert((
                role_kind,
                where_,
                b["roleRef"]["name"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    let mut grants = BTreeSet::new();
    for r in objs
        .iter()
        .filter(|o| ["ClusterRole", "Role"].contains(&kind(o).as_str()))
    {
        let name = r["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let where_ = if kind(r) == "Role" {
            ns(r)
        } else {
            String::new()
        };
        if !bound.contains(&(kind(r), where_.clone(), name.clone())) {
            continue;
        }
        for rule in r["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().unwrap_or_default().to_owned())
                    .collect()
            };
            for g in list("apiGroups") {
                for res in list("resources") {
                    for v in list("verbs") {
                        grants.insert((kind(r), where_.clone(), g.clone(), res.clone(), v));
                    }
                }
            }
        }
    }
    grants
}

/// The operator chart grants exactly what the operator's code uses
/// (`tandem_operator::rbac::USES`, which the operator's unit tests check against every API
/// call in its reconcilers), no more and no less: watching every namespace, all of it by
/// one ClusterRole; watching one namespace, only the cluster-scoped rows (Nodes) by a
/// ClusterRole and every namespaced row (Pods, Secrets, ...) by a Role in that namespace.
#[test]
fn the_operator_chart_grants_exactly_the_verbs_the_operator_uses() {
    use tandem_operator::rbac::{Scope, USES};
    for watch in ["", "research"] {
        let granted = operator_chart_grants(serde_json::json!({"watchNamespace": watch}));
        let mut want = BTreeSet::new();
        for (group, resource, verbs, scope) in USES {
            let (kind, where_) = match scope {
                Scope::Namespaced if !watch.is_empty() => ("Role", watch),
                _ => ("ClusterRole", ""),
            };
            for v in *verbs {
                want.insert((
                    kind.to_owned(),
                    where_.to_owned(),
                    (*group).to_owned(),
                    (*resource).to_owned(),
                    (*v).to_owned(),
                ));
            }
        }
        let extra: Vec<&Grant> = granted.difference(&want).collect();
        let missing: Vec<&Grant> = want.difference(&granted).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "watchNamespace {watch:?}: the chart grants what the operator never uses: \
             {extra:?}; the operator uses what the chart does not grant: {missing:?}"
        );
        if !watch.is_empty() {
            for secret_or_pod in ["secrets", "pods"] {
                assert!(
                    !granted
                        .iter()
                        .any(|(k, _, _, r, _)| k == "ClusterRole" && r == secret_or_pod),
                    "watching one namespace, {secret_or_pod} are granted cluster-wide"
                );
            }
        }
    }
}

// === The documentation: every relative link resolves, the README stays short ===

/// The README is a user's page; the rest lives in the documents it links to.
const README_MAX_LINES: usize = 250;

/// The repository's Markdown files: the tracked ones (`git ls-files`), or, without git (an
/// exported tree), every `*.md` outside `target/` and hidden folders.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let tracked = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z", "--", "*.md"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    if let Some(out) = tracked {
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            // A tracked file being deleted in the working tree is not a document any more.
            .filter(|p| p.is_file())
            .collect();
    }
    let mut found = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || (dir == root && name == "target") {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// GitHub's anchor for a heading: the rendered text lowercased, letters, digits, `-` and
/// `_` kept, spaces turned into `-`, everything else dropped.
fn github_slug(heading: &str) -> String {
    // The heading's text as rendered: `[text](url)` is `text`; code and emphasis marks go.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A Markdown file's anchors (duplicates numbered `-1`, `-2` as GitHub does) and its link
/// targets with their line numbers; code blocks and code spans hold neither.
fn markdown_anchors_and_links(text: &str) -> (BTreeSet<String>, Vec<(usize, String)>) {
    let mut anchors = BTreeSet::new();
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut links = Vec::new();
    // The open fence: its character and length.
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence_char = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        if let Some(c) = fence_char.filter(|_| indent <= 3) {
            let len = trimmed.chars().take_while(|x| *x == c).count();
            if len >= 3 {
                match fence {
                    None => {
                        fence = Some((c, len));
                        continue;
                    }
                    Some((open, open_len))
                        if open == c && len >= open_len && trimmed[len..].trim().is_empty() =>
                    {
                        fence = None;
                        continue;
                    }
                    Some(_) => {}
                }
            }
        }
        if fence.is_some() {
            continue;
        }
        // ATX headings.
        let hashes = trimmed.chars().take_while(|c| *c == '#').count();
        if indent <= 3 && (1..=6).contains(&hashes) && trimmed[hashes..].starts_with([' ', '\t']) {
            let title = trimmed[hashes..].trim().trim_end_matches('#').trim();
            let slug = github_slug(title);
            let n = seen.entry(slug.clone()).or_insert(0);
            anchors.insert(if *n == 0 {
                slug.clone()
            } else {
                format!("{slug}-{n}")
            });
            *n += 1;
        }
        // Reference definitions: `[name]: target`.
        if indent <= 3
            && let Some(after) = trimmed.strip_prefix('[')
            && let Some(close) = after.find("]:")
            && !after[..close].starts_with('^')
        {
            let target = after[close + 2..].split_whitespace().next().unwrap_or("");
            links.push((lineno, target.to_owned()));
            continue;
        }
        // Inline links and images, outside code spans.
        let mut plain = String::new();
        let mut rest = line;
        while let Some(tick) = rest.find('`') {
            plain.push_str(&rest[..tick]);
            let run = rest[tick..].chars().take_while(|c| *c == '`').count();
            let ticks = "`".repeat(run);
            match rest[tick + run..].find(&ticks) {
                Some(end) => {
                    plain.push_str(" code ");
                    rest = &rest[tick + run + end + run..];
                }
                None => {
                    plain.push_str(&rest[tick..tick + run]);
                    rest = &rest[tick + run..];
                }
            }
        }
        plain.push_str(rest);
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let target = &rest[at + 2..];
            // Up to the `)` that closes it (a target may hold balanced parentheses).
            let mut depth = 0usize;
            let mut end = target.len();
            for (j, c) in target.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = j;
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let target = target[..end].trim();
            let target = match target.strip_prefix('<') {
                Some(t) => t.split('>').next().unwrap_or(""),
                None => target.split_whitespace().next().unwrap_or(""),
            };
            links.push((lineno, target.to_owned()));
            rest = &rest[at + 2 + end.min(rest.len() - at - 2)..];
        }
    }
    (anchors, links)
}

/// `a/./b/../c` -> `a/c`; `None` when it climbs above the first component.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// `%20` and the other escapes a link target may carry.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with each relative link of `files` (paths under `root`): a file or folder
/// that does not exist (or lies outside the repository), or an `#anchor` into a Markdown
/// file that has no such heading. External links (`https:`, `mailto:` ...) are not followed.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let root = normalize(root).expect("an absolute root");
    let mut parsed: std::collections::BTreeMap<PathBuf, BTreeSet<String>> = Default::default();
    let mut anchors_of = |path: &Path| -> Option<BTreeSet<String>> {
        if let Some(anchors) = parsed.get(path) {
            return Some(anchors.clone());
        }
        let text = std::fs::read_to_string(path).ok()?;
        let anchors = markdown_anchors_and_links(&text).0;
        parsed.insert(path.to_path_buf(), anchors.clone());
        Some(anchors)
    };
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let (own_anchors, links) = markdown_anchors_and_links(&text);
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, target) in links {
            let is_external = target
                .split(['/', '#', '?'])
                .next()
                .is_some_and(|first| first.contains(':'));
            if target.is_empty() || is_external {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let path = percent_decode(path.split('?').next().unwrap_or(""));
            let resolved = if path.is_empty() {
                Some(file.clone())
            } else if let Some(from_root) = path.strip_prefix('/') {
                normalize(&root.join(from_root))
            } else {
                normalize(&file.parent().unwrap().join(&path))
            };
            let Some(resolved) = resolved.filter(|p| p.starts_with(&root)) else {
                broken.push(format!("{shown}:{line}: {target}: outside the repository"));
                continue;
            };
            if !resolved.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file or folder"));
                continue;
            }
            let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
                continue;
            };
            if resolved.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let anchors = if resolved == *file {
                Some(own_anchors.clone())
            } else {
                anchors_of(&resolved)
            };
            let anchor = percent_decode(anchor).to_lowercase();
            if !anchors.is_some_and(|a| a.contains(&anchor)) {
                broken.push(format!(
                    "{shown}:{line}: {target}: no heading #{anchor} there"
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_markdown_link_resolves_and_the_readme_stays_short() {
    let root = root();
    let files = markdown_files();
    for must in [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "CHANGELOG.md",
    ] {
        assert!(
            files.contains(&root.join(must)),
            "{must} is not among the repository's Markdown files: {files:?}"
        );
    }
    let broken = broken_links(&root, &files);
    assert!(
        broken.is_empty(),
        "broken links in the documentation:\n{}",
        broken.join("\n")
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} (a user's page: move \
         the rest into docs/ and link it)"
    );
}

#[test]
fn the_link_checker_finds_broken_links_and_anchors() {
    assert_eq!(
        github_slug("Kubernetes quick start"),
        "kubernetes-quick-start"
    );
    assert_eq!(
        github_slug("`tandem up`: a [local](x.md) cluster, 2.0!"),
        "tandem-up-a-local-cluster-20"
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(
        root.join("docs/guide.md"),
        "# Guide\n\n## Setup\n\n## Setup\n\n```sh\n# not a heading\n[x](missing-in-code.md)\n```\n",
    )
    .unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n[ok](docs/guide.md#setup-1) [self](#top) [web](https://example.com/x)\n\
         `[code](nope.md)` [gone](docs/gone.md) [bad anchor](docs/guide.md#not-a-heading)\n\
         [fenced](docs/guide.md#not-a-heading-1) [out](../elsewhere.md) [dir](docs/)\n\
         [ref]: docs/missing.md\n",
    )
    .unwrap();
    let files = [root.join("README.md"), root.join("docs/guide.md")];
    let broken = broken_links(&root, &files);
    let want = [
        "README.md:4: docs/gone.md: no such file or folder",
        "README.md:4: docs/guide.md#not-a-heading: no heading #not-a-heading there",
        "README.md:5: docs/guide.md#not-a-heading-1: no heading #not-a-heading-1 there",
        "README.md:5: ../elsewhere.md: outside the repository",
        "README.md:6: docs/missing.md: no such file or folder",
    ];
    assert_eq!(broken, want, "{broken:#?}");
}
