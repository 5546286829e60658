//! `#SBATCH` directives: finding them in a batch script and splitting them into arguments.
//!
//! Pure: text in, argument lists out. What the arguments mean is [`crate::opts`]'s business.
//!
//! # Rules (Slurm's, see `man sbatch`)
//!
//! - The script must start with `#!`; otherwise it is not a batch script.
//! - A directive is a line that starts with `#SBATCH` followed by whitespace. `# SBATCH` or
//!   `##SBATCH` are ordinary comments (the usual way to switch a directive off).
//! - Scanning stops at the first line that is neither blank nor a comment: directives after
//!   the first command are ignored, as Slurm ignores them.
//! - Arguments are split like a shell does for words: whitespace separates, `'...'` and
//!   `"..."` quote, `\` escapes. An unquoted `#` that starts a word begins a trailing comment.

use thiserror::Error;

const MAGIC: &str = "#SBATCH";

/// The arguments of one `#SBATCH` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// 1-based line number in the script, for error messages.
    pub line: usize,
    pub args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DirectiveError {
    #[error(
        "This does not look like a batch script. The first line must start with #! followed by the path to an interpreter. For instance: #!/bin/sh"
    )]
    NoShebang,
    #[error("line {line}: unterminated quote in #SBATCH directive")]
    UnterminatedQuote { line: usize },
    #[error("line {line}: #SBATCH directive ends with a lone backslash")]
    TrailingBackslash { line: usize },
}

/// Checks the `#!` line and collects the directives before the first command.
pub fn parse(script: &str) -> Result<Vec<Directive>, DirectiveError> {
    if !script.starts_with("#!") {
        return Err(DirectiveError::NoShebang);
    }
    let mut directives = Vec::new();
    // The shebang line itself is skipped: it is a comment to this scan.
    for (idx, raw) in script.lines().enumerate().skip(1) {
        let line = idx + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if !trimmed.starts_with('#') {
            break;
        }
        let Some(rest) = raw.strip_prefix(MAGIC) else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            // "#SBATCHX" is a comment, not a directive.
            continue;
        }
        let args = split_words(rest, line)?;
        if !args.is_empty() {
            directives.push(Directive { line, args });
        }
    }
    Ok(directives)
}

/// Shell-like word splitting of one directive's text.
fn split_words(text: &str, line: usize) -> Result<Vec<String>, DirectiveError> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.peek() {
            None | Some('#') => break,
            Some(_) => {}
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                c if c.is_whitespace() => break,
                '\'' => loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(DirectiveError::UnterminatedQuote { line }),
                    }
                },
                '"' => loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err(DirectiveError::UnterminatedQuote { line }),
                        },
                        Some(c) => word.push(c),
                        None => return Err(DirectiveError::UnterminatedQuote { line }),
                    }
                },
                '\\' => match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err(DirectiveError::TrailingBackslash { line }),
                },
                c => word.push(c),
            }
        }
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directive_forms() {
        struct Case {
            name: &'static str,
            script: &'static str,
            want: Vec<(usize, Vec<&'static str>)>,
        }
        let cases = [
            Case {
                name: "equals and space forms, short options",
                script: "#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH -N 2\n#SBATCH -n4\n#SBATCH --time 10:00\necho hi\n",
                want: vec![
                    (2, vec!["--job-name=train"]),
                    (3, vec!["-N", "2"]),
                    (4, vec!["-n4"]),
                    (5, vec!["--time", "10:00"]),
                ],
            },
            Case {
                name: "comments and blank lines between directives are skipped",
                script: "#!/bin/sh\n\n# a comment\n#SBATCH -J a\n   \n## SBATCH -J disabled\n# SBATCH -J disabled\n#SBATCH -p gpu\n",
                want: vec![(4, vec!["-J", "a"]), (8, vec!["-p", "gpu"])],
            },
            Case {
                name: "scanning stops at the first command",
                script: "#!/bin/sh\n#SBATCH -J a\nmodule load cuda\n#SBATCH -J ignored\n",
                want: vec![(2, vec!["-J", "a"])],
            },
            Case {
                name: "trailing comment after the option",
                script: "#!/bin/sh\n#SBATCH --mem=4G   # four gigs\n#SBATCH -t 5 #no space\n",
                want: vec![(2, vec!["--mem=4G"]), (3, vec!["-t", "5"])],
            },
            Case {
                name: "quotes keep spaces and hashes",
                script: "#!/bin/sh\n#SBATCH --comment=\"a # b\"\n#SBATCH -J 'my job'\n#SBATCH --wrap=\"echo \\\"x\\\"\"\n",
                want: vec![
                    (2, vec!["--comment=a # b"]),
                    (3, vec!["-J", "my job"]),
                    (4, vec!["--wrap=echo \"x\""]),
                ],
            },
            Case {
                name: "a hash inside a word is literal",
                script: "#!/bin/sh\n#SBATCH -J run#3\n",
                want: vec![(2, vec!["-J", "run#3"])],
            },
            Case {
                name: "#SBATCH glued to text is a comment; indented #SBATCH is a comment",
                script: "#!/bin/sh\n#SBATCHX -J no\n  #SBATCH -J no\n#SBATCH\n#SBATCH\t-J tab\n",
                want: vec![(5, vec!["-J", "tab"])],
            },
            Case {
                name: "no directives at all",
                script: "#!/bin/sh\necho hello\n",
                want: vec![],
            },
            Case {
                name: "CRLF line endings",
                script: "#!/bin/sh\r\n#SBATCH -J crlf\r\necho\r\n",
                want: vec![(2, vec!["-J", "crlf"])],
            },
        ];
        for case in cases {
            let got = parse(case.script).unwrap();
            let got: Vec<(usize, Vec<&str>)> = got
                .iter()
                .map(|d| (d.line, d.args.iter().map(String::as_str).collect()))
                .collect();
            assert_eq!(got, case.want, "case: {}", case.name);
        }
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("echo no shebang\n", DirectiveError::NoShebang),
            ("", DirectiveError::NoShebang),
            (
                "#!/bin/sh\n#SBATCH -J ok\n#SBATCH -J 'open\n",
                DirectiveError::UnterminatedQuote { line: 3 },
            ),
            (
                "#!/bin/sh\n#SBATCH -J x\\",
                DirectiveError::TrailingBackslash { line: 2 },
            ),
        ];
        for (script, want) in cases {
            assert_eq!(parse(script).unwrap_err(), want, "script: {script:?}");
        }
        assert!(
            DirectiveError::UnterminatedQuote { line: 3 }
                .to_string()
                .contains("line 3")
        );
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        /// Options whose values go through a parser of their own.
        const OPTIONS: &[&str] = &[
            "--time",
            "-t",
            "--time-min",
            "--begin",
            "-b",
            "--array",
            "-a",
            "--dependency",
            "-d",
            "--nodes",
            "-N",
            "--ntasks",
            "-n",
            "--ntasks-per-node",
            "-c",
            "--mem",
            "--mem-per-cpu",
            "--gpus",
            "-G",
            "--gpus-per-node",
            "--gpus-per-task",
            "--gres",
            "--export",
            "--nice",
            "--nodelist",
            "-w",
            "--exclude",
            "--exclusive",
            "--signal",
            "--open-mode",
            "--input",
            "-i",
            "--output",
            "--chdir",
            "--wrap",
            "--requeue",
            "--no-requeue",
            "--hold",
            "-J",
        ];

        fn directive_line() -> impl Strategy<Value = String> {
            (
                proptest::sample::select(OPTIONS),
                prop_oneof![Just("="), Just(" "), Just("")],
                "\\PC{0,16}",
            )
                .prop_map(|(opt, sep, value)| format!("#SBATCH {opt}{sep}{value}"))
        }

        /// Directives, then options, then a spec: each step succeeds or fails with a
        /// one-line error (the CLI prints `sbatch: error: <line>`).
        fn check_submit_path(script: &str) -> Result<(), TestCaseError> {
            fn one_line(e: impl std::fmt::Display) -> Result<(), TestCaseError> {
                let text = e.to_string();
                prop_assert!(
                    !text.is_empty() && !text.contains('\n'),
                    "not one line: {:?}",
                    text
                );
                Ok(())
            }
            let parsed = match parse(script) {
                Ok(d) => d,
                Err(e) => return one_line(e),
            };
            let lines = script.lines().count();
            for d in &parsed {
                prop_assert!(d.line >= 2 && d.line <= lines);
                prop_assert!(!d.args.is_empty());
            }
            let opts = match crate::opts::JobOpts::from_directives(&parsed) {
                Ok(o) => o,
                Err(e) => return one_line(e),
            };
            let ctx = crate::opts::SubmitContext {
                env: vec![("HOME".into(), "/home/p".into())],
                cwd: "/work/p".into(),
                hostname: "login-1".into(),
                sid: 1,
                umask: 0o022,
                now: 1_700_000_000,
                utc_offset_s: Some(-18_000),
            };
            match opts.to_spec(script.to_string(), Vec::new(), "prop.sh", &ctx) {
                Ok(spec) => prop_assert!(spec.nodes_min <= spec.nodes_max),
                Err(e) => one_line(e)?,
            }
            Ok(())
        }

        /// Quotes a word so the shell-like splitter must give it back unchanged.
        fn quote(word: &str) -> String {
            format!("'{}'", word.replace('\'', "'\\''"))
        }

        proptest! {
            // The fuzzing stand-in: any text, any bytes of it, never panics, and either
            // parses or names a line that exists.
            #[test]
            fn arbitrary_scripts_never_panic(body in r#"(#SBATCH |#|[ -~\t\n'"\\])*"#, lines in proptest::collection::vec("[ -~\t]{0,40}", 0..20)) {
                let script = format!("#!/bin/sh\n{body}\n{}", lines.join("\n"));
                match parse(&script) {
                    Ok(ds) => {
                        for d in ds {
                            let _ = crate::opts::JobOpts::from_directives(&[d]);
                        }
                    }
                    Err(DirectiveError::UnterminatedQuote { line } | DirectiveError::TrailingBackslash { line }) => {
                        prop_assert!(line >= 2 && line <= script.lines().count());
                    }
                    Err(DirectiveError::NoShebang) => prop_assert!(false, "script has a shebang"),
                }
            }

            // The stable twin of the cargo-fuzz target (cli/fuzz): any text, then the
            // whole path sbatch takes before it talks to the controller.
            #[test]
            fn any_text_gives_a_spec_or_a_one_line_error(text in "\\PC*(\n\\PC*){0,8}") {
                check_submit_path(&format!("#!/bin/sh\n{text}"))?;
                check_submit_path(&text)?;
            }

            // Real option names with arbitrary values reach clap's value parsers and
            // `to_spec`, which random text alone rarely does.
            #[test]
            fn option_lines_with_arbitrary_values_give_a_spec_or_a_one_line_error(
                lines in proptest::collection::vec(prop_oneof![directive_line(), "\\PC{0,40}"], 0..12),
            ) {
                check_submit_path(&format!("#!/bin/sh\n{}\n", lines.join("\n")))?;
            }

            #[test]
            fn quoted_words_round_trip(words in proptest::collection::vec("[^\n\r]{1,12}", 1..6)) {
                let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
                let script = format!("#!/bin/sh\n#SBATCH {}\n", line.join(" "));
                let ds = parse(&script).unwrap();
                prop_assert_eq!(ds.len(), 1);
                prop_assert_eq!(&ds[0].args, &words);
            }
        }
    }
}
