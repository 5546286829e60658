//! The `tandem` binary: the controller and worker daemons, the all-in-one local cluster, and
//! the Slurm commands (`sbatch`, `squeue`, `scancel`, `sinfo`, `sacct`, `scontrol`, `srun`,
//! `sacctmgr`, `sshare`, `sprio`); and `tandem-slurm`, the same Slurm commands and the
//! worker's job launcher without the daemons, which the command links point to.
//!
//! # Layout
//!
//! ```text
//! main.rs          thin: calls main_from_env
//! bin/tandem-slurm.rs  thin: calls slurm_main_from_env
//! lib.rs           argv[0] / subcommand dispatch, one-line errors, exit codes, runtimes
//! cmd/             one module per command: sbatch squeue scancel sinfo sacct scontrol srun
//!                  sacctmgr sshare sprio
//!                  (Slurm's), controller worker (daemons), up down links demo (local cluster), sim (trace replay)
//! directives.rs    #SBATCH lines out of a script (pure)
//! opts.rs          JobOpts shared by sbatch, srun and #SBATCH; -> JobSpec (pure)
//! jobref.rs        "12", "12_3", "12_[3-5]" job references (pure)
//! format/          Output trait: Slurm tables and key=value blocks, or JSON
//! client.rs        finding and authenticating to the cluster
//! clock.rs         the wall clock and time zone, read only here
//! ```
//!
//! # Invariants
//!
//! - Options are validated before any RPC: a bad option creates nothing.
//! - Errors print once, as `<command>: error: <message>` on one line, and exit non-zero.
//! - Client commands run on a single-threaded runtime; daemons get a multi-threaded one.

pub mod client;
pub mod clock;
pub mod cmd;
pub mod directives;
pub mod format;
pub mod jobref;
pub mod opts;
pub mod timing;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// The Slurm command names the binary answers to by argv[0].
pub const SLURM_COMMANDS: [&str; 10] = [
    "sbatch", "squeue", "scancel", "sinfo", "sacct", "scontrol", "srun", "sacctmgr", "sshare",
    "sprio",
];

/// Tandem: Slurm-compatible batch scheduling for GPU pools.
#[derive(Debug, Parser)]
#[command(name = "tandem", version, args_override_self = true)]
struct Tandem {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Slurm(Box<SlurmCommand>),
    /// Run the batch controller daemon.
    Controller(cmd::controller::Args),
    /// Run the node agent daemon.
    Worker(cmd::worker::Args),
    /// Run the local identity agent: credentials for local users, by their kernel uid.
    Authd(cmd::authd::Args),
    /// Start an all-in-one local cluster (controller and workers) and return when it is ready.
    Up(cmd::up::Args),
    /// Stop the local cluster started by `tandem up`.
    Down(cmd::down::Args),
    /// Create sbatch, squeue, ... links (to tandem-slurm beside this binary) in a directory.
    Links(cmd::links::Args),
    /// Start a local cluster, run the example workload through the CLI, show it, stop.
    Demo(cmd::demo::Args),
    /// Replay a workload trace through the scheduling core with simulated time.
    Sim(cmd::sim::Args),
}

/// The Slurm commands: what both binaries run (`tandem sbatch`, or `sbatch` linked to either).
#[derive(Debug, Subcommand)]
enum SlurmCommand {
    /// Submit a batch script.
    Sbatch(cmd::sbatch::Args),
    /// Show queued and running jobs.
    Squeue(cmd::squeue::Args),
    /// Cancel or signal jobs.
    Scancel(cmd::scancel::Args),
    /// Show partitions and nodes.
    Sinfo(cmd::sinfo::Args),
    /// Show accounting records of jobs and steps.
    Sacct(cmd::sacct::Args),
    /// Show and change jobs, nodes and partitions.
    Scontrol(cmd::scontrol::Args),
    /// Run a parallel job step.
    Srun(cmd::srun::Args),
    /// View and change accounts, users and QOS.
    Sacctmgr(cmd::sacctmgr::Args),
    /// Show fair-share numbers of the association tree.
    Sshare(cmd::sshare::Args),
    /// Show the priority factors of pending jobs.
    Sprio(cmd::sprio::Args),
}

/// Entry point of `tandem`: everything.
pub fn main_from_env() -> u8 {
    timing::mark("main");
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = per_call_main(&args) {
        return code;
    }
    match Tandem::try_parse_from(&args) {
        Ok(t) => {
            let name = command_name(&t.command);
            run(name, t.command)
        }
        Err(e) => clap_exit("tandem", e),
    }
}

/// Entry point of `tandem-slurm`: the Slurm commands (by argv[0], or `tandem-slurm sbatch
/// ...`) and the worker's job launcher, without the daemons. Every `sbatch` in a user's
/// loop and every job start execs a binary; this one is a tenth of `tandem`'s size, so the
/// kernel maps, faults in and tears down that much less, and the loader relocates that much
/// less, per call.
pub fn slurm_main_from_env() -> u8 {
    timing::mark("main");
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = per_call_main(&args) {
        return code;
    }
    let program = program_name(&args);
    eprintln!(
        "{program}: error: this binary runs the Slurm commands ({}) by their name or as \
         `{program} sbatch ...`; the daemons and the local cluster are `tandem`'s",
        SLURM_COMMANDS.join(", ")
    );
    2
}

/// The part both binaries answer: the job launcher, `sbatch ...` by argv[0] and
/// `<binary> sbatch ...`. `None` when `args` are none of these.
fn per_call_main(args: &[OsString]) -> Option<u8> {
    // The worker's job launcher (`tandem_worker::launch::exec`): no parsing, no runtime.
    if args
        .get(1)
        .is_some_and(|a| a == tandem_worker::launch::exec::SUBCOMMAND)
    {
        return Some(tandem_worker::launch::exec::main_code(&args[2..]));
    }
    let invoked = program_name(args);
    if SLURM_COMMANDS.contains(&invoked.as_str()) {
        return Some(match parse_slurm(&invoked, args) {
            Ok(c) => run_slurm(&invoked, c),
            Err(e) => clap_exit(&invoked, e),
        });
    }
    let name = args
        .get(1)
        .and_then(|a| a.to_str())
        .filter(|a| SLURM_COMMANDS.contains(a))?
        .to_string();
    // `tandem sbatch ...` parses as `sbatch ...`: building the parser of every subcommand
    // (the daemons' flags included) costs ~0.25 ms, 5% of an sbatch round trip. clap takes
    // the program name from argv[0], so usage still says `tandem sbatch`; errors report as
    // `sbatch: error: ...`, the way the user thinks of it.
    let mut sub_args = args[1..].to_vec();
    sub_args[0] = format!("{invoked} {name}").into();
    Some(match parse_slurm(&name, &sub_args) {
        Ok(c) => run_slurm(&name, c),
        Err(e) => clap_exit(&name, e),
    })
}

/// The file name the binary was invoked as (`sbatch` through a link).
fn program_name(args: &[OsString]) -> String {
    args.first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("tandem")
        .to_string()
}

fn parse_slurm(name: &str, args: &[OsString]) -> Result<SlurmCommand, clap::Error> {
    Ok(match name {
        "sbatch" => SlurmCommand::Sbatch(parse_getopt(args)?),
        "squeue" => SlurmCommand::Squeue(parse_getopt(args)?),
        "scancel" => SlurmCommand::Scancel(parse_getopt(args)?),
        "sinfo" => SlurmCommand::Sinfo(parse_getopt(args)?),
        "sacct" => SlurmCommand::Sacct(parse_getopt(args)?),
        "scontrol" => SlurmCommand::Scontrol(parse_getopt(args)?),
        "sacctmgr" => SlurmCommand::Sacctmgr(parse_getopt(args)?),
        "sshare" => SlurmCommand::Sshare(parse_getopt(args)?),
        "sprio" => SlurmCommand::Sprio(parse_getopt(args)?),
        _ => SlurmCommand::Srun(parse_getopt(args)?),
    })
}

/// Parses a Slurm command line the way Slurm's getopt loop takes it: an option given twice
/// is not an error (`squeue -h --noheader`, a wrapper script adding `-p` to a user's `-p`),
/// and a single-valued option's last value wins. Options Slurm accumulates (sacct's `-j`,
/// `-o`, `-s`, sshare's `-A`) are declared `Append` in their command and keep every value;
/// list options Slurm replaces (squeue's `-u`, `-t`, `-p`) are declared `Set`.
pub fn parse_getopt<A: clap::Parser>(args: &[OsString]) -> Result<A, clap::Error> {
    let mut matches = A::command()
        .args_override_self(true)
        .try_get_matches_from(args)?;
    A::from_arg_matches_mut(&mut matches)
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Slurm(c) => slurm_command_name(c),
        Command::Controller(_) => "tandem controller",
        Command::Worker(_) => "tandem worker",
        Command::Authd(_) => "tandem authd",
        Command::Up(_) => "tandem up",
        Command::Down(_) => "tandem down",
        Command::Links(_) => "tandem links",
        Command::Demo(_) => "tandem demo",
        Command::Sim(_) => "tandem sim",
    }
}

fn slurm_command_name(c: &SlurmCommand) -> &'static str {
    match c {
        SlurmCommand::Sbatch(_) => "sbatch",
        SlurmCommand::Squeue(_) => "squeue",
        SlurmCommand::Scancel(_) => "scancel",
        SlurmCommand::Sinfo(_) => "sinfo",
        SlurmCommand::Sacct(_) => "sacct",
        SlurmCommand::Scontrol(_) => "scontrol",
        SlurmCommand::Srun(_) => "srun",
        SlurmCommand::Sacctmgr(_) => "sacctmgr",
        SlurmCommand::Sshare(_) => "sshare",
        SlurmCommand::Sprio(_) => "sprio",
    }
}

/// What the Slurm commands answer to `-V`/`--version`: the Slurm release whose behaviour
/// they follow (checked against it side by side), first, as scripts that parse Slurm's
/// `slurm 22.05.8` expect it, then what they really are.
pub const SLURM_VERSION_LINE: &str =
    concat!("slurm 22.05.8 (tandem ", env!("CARGO_PKG_VERSION"), ")");

/// Help and version go to stdout with success; real parse errors become one line.
fn clap_exit(name: &str, e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    if e.kind() == ErrorKind::DisplayVersion && SLURM_COMMANDS.contains(&name) {
        println!("{SLURM_VERSION_LINE}");
        return 0;
    }
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                2
            } else {
                0
            }
        }
        _ => {
            eprintln!("{name}: error: {}", opts::clap_one_line(&e));
            1
        }
    }
}

/// What a command asks the process to exit with.
pub type Exit = anyhow::Result<u8>;

fn run(name: &str, command: Command) -> u8 {
    timing::mark("parsed");
    let result = match command {
        Command::Slurm(c) => return run_slurm(name, *c),
        Command::Controller(a) => run_daemon(cmd::controller::run(a)),
        Command::Worker(a) => run_daemon(cmd::worker::run(a)),
        Command::Authd(a) => run_daemon(cmd::authd::run(a)),
        Command::Up(a) => client_runtime().and_then(|rt| rt.block_on(cmd::up::run(a))),
        Command::Down(a) => cmd::down::run(a),
        Command::Links(a) => cmd::links::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Demo(a) => client_runtime().and_then(|rt| rt.block_on(cmd::demo::run(a))),
    };
    finish(name, result)
}

fn run_slurm(name: &str, command: SlurmCommand) -> u8 {
    timing::mark("parsed");
    let result = client_runtime().and_then(|rt| match command {
        SlurmCommand::Sbatch(a) => rt.block_on(cmd::sbatch::run(a)),
        SlurmCommand::Squeue(a) => rt.block_on(cmd::squeue::run(a)),
        SlurmCommand::Scancel(a) => rt.block_on(cmd::scancel::run(a)),
        SlurmCommand::Sinfo(a) => rt.block_on(cmd::sinfo::run(a)),
        SlurmCommand::Sacct(a) => rt.block_on(cmd::sacct::run(a)),
        SlurmCommand::Scontrol(a) => rt.block_on(cmd::scontrol::run(a)),
        SlurmCommand::Srun(a) => rt.block_on(cmd::srun::run(a)),
        SlurmCommand::Sacctmgr(a) => rt.block_on(cmd::sacctmgr::run(a)),
        SlurmCommand::Sshare(a) => rt.block_on(cmd::sshare::run(a)),
        SlurmCommand::Sprio(a) => rt.block_on(cmd::sprio::run(a)),
    });
    finish(name, result)
}

/// The exit code of a command's result; an error prints as one line.
fn finish(name: &str, result: Exit) -> u8 {
    timing::mark("done");
    match result {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}");
            // One line, always: multi-line causes (gRPC details, io errors) are folded.
            let msg = msg.lines().map(str::trim).collect::<Vec<_>>().join(" ");
            eprintln!("{name}: error: {msg}");
            1
        }
    }
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    timing::mark("runtime");
    Ok(rt)
}

/// Runs a daemon as a task of a multi-threaded runtime, not in `block_on` on the main
/// thread: its accept loop then runs on the worker thread that polled the listener's
/// readiness, and the connection it spawns goes to that thread's own queue. In `block_on`
/// every new connection (each `sbatch` is one) cost two thread wake-ups before its first
/// byte was read: the I/O thread waking the main thread to accept, and the main thread
/// waking a worker for the connection task.
fn run_daemon<F>(daemon: F) -> Exit
where
    F: std::future::Future<Output = Exit> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match tokio::spawn(daemon).await {
            Ok(exit) => exit,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(anyhow::anyhow!("the daemon's task ended: {e}")),
        }
    })
}

/// Writes a command's output to stdout. A closed pipe (`squeue | head -1`) is not an error:
/// the reader has what it wanted.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Logs of the daemons go to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: `tandem up` sends daemon logs to files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// A future that resolves on ctrl-c or SIGTERM: the daemons' shutdown signal.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// This package links the unwinder statically (`build.rs`): a panic must still unwind
    /// (tokio turns a panicking task into an error only by catching the unwind).
    #[test]
    fn panics_unwind_with_the_linked_in_unwinder() {
        let caught = std::panic::catch_unwind(|| {
            let v: Vec<u8> = Vec::new();
            v[std::hint::black_box(3)]
        });
        assert!(caught.is_err());
    }

    #[test]
    fn every_command_line_is_well_formed() {
        Tandem::command().debug_assert();
        cmd::sbatch::Args::command().debug_assert();
        cmd::squeue::Args::command().debug_assert();
        cmd::scancel::Args::command().debug_assert();
        cmd::sinfo::Args::command().debug_assert();
        cmd::sacct::Args::command().debug_assert();
        cmd::scontrol::Args::command().debug_assert();
        cmd::srun::Args::command().debug_assert();
        cmd::sacctmgr::Args::command().debug_assert();
        cmd::sshare::Args::command().debug_assert();
        cmd::sprio::Args::command().debug_assert();
    }

    fn getopt<A: clap::Parser>(line: &str) -> A {
        let args: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        match parse_getopt::<A>(&args) {
            Ok(a) => a,
            Err(e) => panic!("{line}: {e}"),
        }
    }

    /// Every command takes an option given twice, as Slurm 22.05's getopt loops did (each
    /// case quotes what the reference Slurm printed): a single value and the lists Slurm
    /// replaces keep the last one, the lists Slurm adds to (`slurm_addto_char_list`) keep
    /// all, and a flag given twice is still the flag.
    #[test]
    fn every_command_takes_an_option_given_twice_as_slurm_does() {
        // `sinfo -p debug -p batch` showed batch only, `-t idle -t mix` mixed nodes only,
        // `-n n1 -n n5` n5 only, `-o '%P' -o '%D %t'` the NODES STATE columns, `-h -h`
        // and `-N -N` once.
        let a: cmd::sinfo::Args = getopt(
            "sinfo -p debug -p batch -t idle -t mix -n n1 -n n5 -o %P -o %D -h -h -N -N -l -l \
             --json --json",
        );
        assert_eq!(a.partitions, ["batch"]);
        assert_eq!(a.states, ["mix"]);
        assert_eq!(a.nodes.as_deref(), Some("n5"));
        assert_eq!(a.format.as_deref(), Some("%D"));
        assert!(a.noheader && a.node_oriented && a.long && a.json);

        // `squeue -n na1 -n na2` listed na2, `-A a1 -A a3` a3's jobs, `-j11 -j12` 12, `-S i
        // -S -i` descending ids, `-o %i -o %j` names, `-O name -O jobid` ids; -h -r -l -a
        // --me twice were taken.
        let a: cmd::squeue::Args = getopt(
            "squeue -n na1 -n na2 -A a1 -A a3 -j11 -j12 -S i -S -i -o %i -o %j -u nobody -u root \
             -t R -t PD -p debug -p batch -h -h -r -r -l -l -a -a --me --me",
        );
        assert_eq!(a.names, ["na2"]);
        assert_eq!(a.accounts, ["a3"]);
        assert_eq!(a.jobs, ["12"]);
        assert_eq!(a.sort.as_deref(), Some("-i"));
        assert_eq!(a.format.as_deref(), Some("%j"));
        assert_eq!(
            (a.users, a.states, a.partitions),
            (
                vec!["root".to_string()],
                vec!["PD".to_string()],
                vec!["batch".to_string()]
            )
        );
        assert!(a.noheader && a.array && a.long && a.all && a.me);
        let a: cmd::squeue::Args = getopt("squeue -O name -O jobid");
        assert_eq!(a.named.as_deref(), Some("jobid"));
        // `squeue -o %i -O jobid,name`: "-O (--Format) is incompatible with -o (--format)".
        let both = ["squeue", "-o", "%i", "-O", "jobid"].map(OsString::from);
        assert!(parse_getopt::<cmd::squeue::Args>(&both).is_err());

        // `sacct` added up `-A a1 -A a3`, `-s CD -s F`, `--name pend1 --name pend3`, `-r
        // batch -r debug`, `-u nobody -u root`, `-o JobID -o State` and `-j 10 -j 11`;
        // `-S 2020-01-01 -S now` and `-E 2020-01-02 -E now` took the last time.
        let a: cmd::sacct::Args = getopt(
            "sacct -A a1 -A a3 -s CD -s F --name p1 --name p3 -r batch -r debug -u nobody -u root \
             -o JobID -o State -j 10 -j 11 -S 2020-01-01 -S now -E 2020-01-02 -E now -X -X -n -n \
             -P -P -b -b -D -D --json --json",
        );
        assert_eq!(a.accounts, ["a1", "a3"]);
        assert_eq!(a.states, ["CD", "F"]);
        assert_eq!(a.names, ["p1", "p3"]);
        assert_eq!(a.partitions, ["batch", "debug"]);
        assert_eq!(a.users, ["nobody", "root"]);
        assert_eq!(a.format, ["JobID", "State"]);
        assert_eq!(a.jobs, ["10", "11"]);
        assert_eq!(
            (a.start.as_deref(), a.end.as_deref()),
            (Some("now"), Some("now"))
        );
        assert!(a.allocations && a.noheader && a.parsable2 && a.brief && a.duplicates && a.json);

        // `scancel -A a3 -A a1 -n na3 -n na1` cancelled a1's na1 only, `-t R -t PD` the
        // pending one, `-p debug -p batch` in batch, `-u root -u nobody` nothing.
        let a: cmd::scancel::Args = getopt(
            "scancel -A a3 -A a1 -n na3 -n na1 -t R -t PD -p debug -p batch -u root -u nobody -s \
             TERM -s USR1 -b -b --me --me",
        );
        assert_eq!(a.account.as_deref(), Some("a1"));
        assert_eq!(a.name.as_deref(), Some("na1"));
        assert_eq!(a.states, ["PD"]);
        assert_eq!(a.partition.as_deref(), Some("batch"));
        assert_eq!(a.user.as_deref(), Some("nobody"));
        assert_eq!(a.signal.as_deref(), Some("USR1"));
        assert!(a.batch && a.me);

        // `sshare -A a1 -A a3` showed a1 and a3, `-A a1,a2 -A a3` all three, `-u nobody -u
        // root` and `-u root -u nobody` root's lines; `-a -a -n -n -P -P -l -l` were taken.
        let a: cmd::sshare::Args = getopt(
            "sshare -A a1,a2 -A a3 -u root -u nobody -a -a -n -n -P -P -l -l -p -p --json --json",
        );
        assert_eq!(a.accounts, ["a1,a2", "a3"]);
        assert_eq!(a.users, ["root", "nobody"]);
        assert!(a.all && a.noheader && a.parsable2 && a.long && a.parsable && a.json);

        // `sprio -j15 -j16` showed 16, `--jobs=15,14 --jobs=16` 16, `-u nobody -u root`
        // root's jobs and `-u root -u nobody` none; `-h -h -l -l -n -n -w -w` were taken.
        let a: cmd::sprio::Args =
            getopt("sprio -j15 -j16 -u root -u nobody -h -h -l -l -n -n -w -w --json --json");
        assert_eq!(a.jobs, ["16"]);
        assert_eq!(a.users, ["nobody"]);
        assert!(a.noheader && a.long && a.norm && a.weights && a.json);

        // `sacctmgr -n -n -P -P show account name=a1 name=a3` printed both (the words are
        // checked in sacctmgr's own tests).
        let a: cmd::sacctmgr::Args = getopt("sacctmgr -n -n -P -P -i -i -Q -Q -p -p show account");
        assert!(a.noheader && a.parsable2 && a.immediate && a.quiet && a.parsable);
        assert_eq!(a.words, ["show", "account"]);

        let a: cmd::scontrol::Args = getopt("scontrol --json --json show job 5");
        assert!(a.json);
        assert_eq!(a.words, ["show", "job", "5"]);

        // `srun -N2 -N1 -n 3 -n 1` ran one task on one node; `-c 2 -c 4` gave
        // SLURM_CPUS_PER_TASK=4; `-p debug -p batch -t 5 -t 1` ran in batch with 1:00.
        let a: cmd::srun::Args = getopt(
            "srun -N2 -N1 -n 3 -n 1 -c 2 -c 4 -p debug -p batch -t 5 -t 1 -J a -J b -l -l true",
        );
        assert_eq!(a.opts.nodes.map(|n| n.min), Some(1));
        assert_eq!((a.opts.ntasks, a.opts.cpus_per_task), (Some(1), Some(4)));
        assert_eq!(a.opts.partition.as_deref(), Some("batch"));
        assert_eq!(a.opts.time.map(|t| t.0), Some(Some(60)));
        assert_eq!(a.opts.job_name.as_deref(), Some("b"));
        assert!(a.label);
        assert_eq!(a.command, ["true"]);

        // `sbatch -H --gres=gpu:1 --gres=gpu:2 -w n1 -w n2 -x n3 -x n4 --comment=x
        // --comment=y -N1 -N2 -n2 -n4 -c1 -c2 --mem=10 --mem=20 -d singleton -d afterany:1`:
        // scontrol showed ReqNodeList=n2 ExcNodeList=n4 NumNodes=2-2 NumTasks=4 CPUs/Task=2
        // MinMemoryNode=20M gres/gpu=4 (2 a node) Comment=y Dependency=afterany:1.
        let a: cmd::sbatch::Args = getopt(
            "sbatch -H -H --gres=gpu:1 --gres=gpu:2 -w n1 -w n2 -x n3 -x n4 --comment=x \
             --comment=y -N1 -N2 -n2 -n4 -c1 -c2 --mem=10 --mem=20 -d singleton -d afterany:1 \
             --wrap true",
        );
        let o = a.opts;
        assert_eq!(o.gres.map(|g| g.count), Some(2));
        assert_eq!(
            (o.nodelist.as_deref(), o.exclude.as_deref()),
            (Some("n2"), Some("n4"))
        );
        assert_eq!(o.comment.as_deref(), Some("y"));
        assert_eq!(o.nodes.map(|n| (n.min, n.max)), Some((2, 2)));
        assert_eq!(
            (o.ntasks, o.cpus_per_task, o.mem),
            (Some(4), Some(2), Some(20))
        );
        assert_eq!(o.dependency.as_deref(), Some("afterany:1"));
        assert!(o.hold);
    }
}
