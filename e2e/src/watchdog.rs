//! A deadline for a whole test. Every wait of the harness has its own bound, but a hang can
//! still hide in a drop, in a runtime's shutdown or in code under test; then the test would
//! run until CI gave up on the whole suite, and say nothing. Past its deadline the watchdog
//! prints what the machine looks like (this process's threads and every process under it,
//! with their kernel wait channels, and the tails of the logs the test registered) and ends
//! the test binary with a failure.
//!
//! Armed once per test thread ([`arm`]); disarmed when that thread ends, which libtest does
//! after the test function returned and its runtime shut down, so a hang in either counts.

use std::cell::RefCell;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The deadline unless `TANDEM_TEST_DEADLINE_S` gives another: the slowest e2e test takes
/// about a minute on two cores.
const DEFAULT_LIMIT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Shared {
    done: Mutex<bool>,
    wake: Condvar,
    logs: Mutex<Vec<PathBuf>>,
}

/// Disarms the watchdog when dropped (with its thread's locals).
struct Armed(Arc<Shared>);

impl Drop for Armed {
    fn drop(&mut self) {
        *self.0.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.wake.notify_all();
    }
}

thread_local! {
    static ARMED: RefCell<Option<Armed>> = const { RefCell::new(None) };
}

/// Arms the watchdog for the test running on this thread (once; later calls do nothing).
pub fn arm() {
    ARMED.with(|a| {
        let mut a = a.borrow_mut();
        if a.is_some() {
            return;
        }
        let limit = std::env::var("TANDEM_TEST_DEADLINE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        let test = std::thread::current()
            .name()
            .unwrap_or("an unnamed test thread")
            .to_owned();
        let shared = Arc::new(Shared::default());
        let watch = shared.clone();
        std::thread::spawn(move || expire(&watch, &test, limit));
        *a = Some(Armed(shared));
    });
}

/// Adds the `*.log` files of `dir` to what an expired watchdog prints.
pub fn logs_in(dir: &Path) {
    ARMED.with(|a| {
        if let Some(Armed(s)) = a.borrow().as_ref() {
            s.logs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(dir.to_owned());
        }
    });
}

fn expire(shared: &Shared, test: &str, limit: Duration) {
    let done = shared.done.lock().unwrap_or_else(|e| e.into_inner());
    let (done, _) = shared
        .wake
        .wait_timeout_while(done, limit, |d| !*d)
        .unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    drop(done);
    let logs = shared
        .logs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let report = report(test, limit, &logs);
    // Straight to the process's stderr: libtest's capture would keep a report made with
    // `eprintln!` until the test ends, which it never will.
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(report.as_bytes());
    let _ = err.flush();
    std::process::exit(101);
}

/// Least telling first: CI keeps the tail of a long output.
fn report(test: &str, limit: Duration, logs: &[PathBuf]) -> String {
    let me = std::process::id();
    let mut out = String::from("\n");
    for dir in logs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|f| f.extension().is_some_and(|e| e == "log"));
        files.sort();
        for f in files {
            let text = read(&f);
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {} (last 30 lines)\n", f.display());
            for l in &lines[lines.len().saturating_sub(30)..] {
                out += &clip(l);
                out.push('\n');
            }
        }
    }
    // Tandem's own processes under the test (controller, workers, bridges): the other
    // side of a call that never returned.
    for pid in descendants(me) {
        let cmd = read(Path::new(&format!("/proc/{pid}/cmdline"))).replace('\0', " ");
        if cmd
            .split_whitespace()
            .next()
            .is_some_and(|b| b.contains("tandem"))
        {
            out += &format!("{}:\n", clip(&describe_process(pid)));
            out += &backtraces(pid, true);
        }
    }
    out += &backtraces(me, false);
    out += "\nthreads of this process:\n";
    for tid in numbered_entries(Path::new("/proc/self/task")) {
        let task = PathBuf::from(format!("/proc/self/task/{tid}"));
        out += &format!(
            "  {tid} {} {}: wchan {}\n",
            read(&task.join("comm")).trim(),
            state_of(&read(&task.join("stat"))),
            read(&task.join("wchan")).trim()
        );
    }
    out += "processes under this one:\n";
    for pid in descendants(me) {
        out += &format!("  {}\n", clip(&describe_process(pid)));
    }
    out += &format!(
        "WATCHDOG: {test} still running after {} s (TANDEM_TEST_DEADLINE_S); ending the test binary.\n",
        limit.as_secs()
    );
    out
}

fn clip(line: &str) -> String {
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

/// Every thread's stack, symbolized, by `gdb` attached for a moment (where it is installed
/// and may trace `pid`): it names the wait that never ended. `own_only`: only the frames
/// in this workspace's code.
fn backtraces(pid: u32, own_only: bool) -> String {
    let mut gdb = std::process::Command::new("gdb");
    gdb.args(["-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt 40"])
        .stdin(std::process::Stdio::null());
    match crate::bounded::output_within(&mut gdb, Duration::from_secs(30)) {
        // Each thread's innermost frames and those in this workspace's code.
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let kept: Vec<String> = text
                .lines()
                .filter(|l| {
                    let own = l.starts_with('#') && l.contains("tandem");
                    if own_only {
                        return own;
                    }
                    own || l.starts_with("Thread ")
                        || ["#0 ", "#1 ", "#2 "].iter().any(|f| l.starts_with(f))
                })
                .map(clip)
                .collect();
            format!("backtraces (gdb):\n{}\n", kept.join("\n"))
        }
        Err(e) => format!("no backtraces: {e}\n"),
    }
}

/// `pid state wchan: command line` of one process, from `/proc`.
pub fn describe_process(pid: u32) -> String {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let cmd = read(&dir.join("cmdline")).replace('\0', " ");
    format!(
        "{pid} {} wchan {}: {}",
        state_of(&read(&dir.join("stat"))),
        read(&dir.join("wchan")).trim(),
        cmd.trim()
    )
}

/// Every process whose parent chain leads to `root`, parents first.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = numbered_entries(Path::new("/proc"))
        .into_iter()
        .filter_map(|pid| {
            let stat = read(Path::new(&format!("/proc/{pid}/stat")));
            parent_of(&stat).map(|ppid| (pid, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            out.push(*child);
            frontier.push(*child);
        }
    }
    out
}

/// The state letter of a `/proc/…/stat` line (after the parenthesised command, which may
/// itself hold spaces and parentheses).
fn state_of(stat: &str) -> String {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("?")
        .to_owned()
}

fn parent_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn numbered_entries(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let stat = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560";
        assert_eq!(state_of(stat), "S");
        assert_eq!(parent_of(stat), Some(17));
        assert_eq!(state_of("garbage"), "?");
        assert_eq!(parent_of("garbage"), None);
    }

    #[test]
    fn a_child_is_found_and_described() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let found = descendants(std::process::id());
        assert!(found.contains(&child.id()), "{found:?}");
        let d = describe_process(child.id());
        assert!(d.contains("sleep 30"), "{d}");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    #[ignore = "hangs on purpose; run in a child process by a_hung_test_ends_the_binary_with_a_report"]
    fn hangs_past_its_deadline() {
        arm();
        std::thread::sleep(Duration::from_secs(60));
    }

    #[test]
    fn a_hung_test_ends_the_binary_with_a_report() {
        let exe = std::env::current_exe().unwrap();
        let out = crate::bounded::output_within(
            std::process::Command::new(exe)
                .args([
                    "--exact",
                    "watchdog::tests::hangs_past_its_deadline",
                    "--ignored",
                ])
                .env("TANDEM_TEST_DEADLINE_S", "1"),
            Duration::from_secs(30),
        )
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(101), "{err}");
        assert!(
            err.contains(
                "WATCHDOG: watchdog::tests::hangs_past_its_deadline still running after 1 s"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_test_that_ends_disarms_it() {
        let shared = std::thread::spawn(|| {
            arm();
            ARMED.with(|a| a.borrow().as_ref().map(|a| a.0.clone()))
        })
        .join()
        .unwrap()
        .unwrap();
        assert!(*shared.done.lock().unwrap(), "disarmed with its thread");
    }

    #[test]
    fn the_report_names_the_test_and_this_process_threads() {
        let r = report("some::test", Duration::from_secs(5), &[]);
        assert!(r.contains("some::test still running after 5 s"), "{r}");
        assert!(r.contains("threads of this process"), "{r}");
    }
}
