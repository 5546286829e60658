//! Reading Standard Workload Format traces (`.swf`, or `.swf.gz` by its gzip
//! magic bytes), and cleaning records into jobs the replay can run.
//!
//! SWF has one job per line, 18 whitespace-separated fields, `-1` for
//! "unknown", and `;` header comment lines of which `MaxProcs` and `MaxNodes`
//! matter here. Parsing keeps the record faithful ([`SwfRecord`], missing
//! values as `None`); [`clean`] applies the replay rules and says how many
//! records each rule dropped.
//!
//! This module is the simulator's only file access: the caller hands it a path.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::Serialize;

use super::SimError;

/// The `;` header values the replay needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SwfHeader {
    /// `MaxProcs`: processors in the machine.
    pub max_procs: Option<u64>,
    /// `MaxNodes`: nodes in the machine.
    pub max_nodes: Option<u64>,
    /// `UnixStartTime`: what submit time 0 means.
    pub unix_start_time: Option<i64>,
}

impl SwfHeader {
    /// Machine size in processors: `MaxProcs`, else `MaxNodes` (models such
    /// as Lublin's give only `MaxNodes` and mean one processor per node).
    pub fn machine_procs(&self) -> Option<u64> {
        self.max_procs.or(self.max_nodes).filter(|p| *p > 0)
    }
}

/// One SWF line. Fields that are `-1` in the file are `None`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SwfRecord {
    /// 1: job number.
    pub id: u64,
    /// 2: submit time (s, from the log's start).
    pub submit: i64,
    /// 3: wait time the original scheduler produced.
    pub wait: Option<i64>,
    /// 4: run time (s).
    pub run: Option<i64>,
    /// 5: allocated processors.
    pub alloc_procs: Option<u64>,
    /// 8: requested processors.
    pub req_procs: Option<u64>,
    /// 9: requested time (the user's estimate).
    pub req_time: Option<i64>,
    /// 11: status (1 completed, 0 failed, 5 cancelled).
    pub status: Option<i64>,
    /// 12: user id.
    pub user: Option<u32>,
    /// 13: group id.
    pub group: Option<u32>,
    /// 15: queue number.
    pub queue: Option<i64>,
    /// 16: partition number.
    pub partition: Option<i64>,
}

/// A parsed trace.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SwfTrace {
    pub header: SwfHeader,
    pub records: Vec<SwfRecord>,
}

/// Read a trace from a file; gzip is recognised by its magic bytes, so a
/// `.swf.gz` renamed `.swf` still reads.
pub fn read(path: &Path) -> Result<SwfTrace, SimError> {
    let io_err = |source| SimError::ReadTrace {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let mut magic = [0u8; 2];
    let got = read_up_to(&mut file, &mut magic).map_err(io_err)?;
    let file = File::open(path).map_err(io_err)?;
    if got == 2 && magic == [0x1f, 0x8b] {
        parse(BufReader::new(MultiGzDecoder::new(file)), path)
    } else {
        parse(BufReader::new(file), path)
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Parse SWF text. `path` only names the source in errors.
pub fn parse(reader: impl BufRead, path: &Path) -> Result<SwfTrace, SimError> {
    let mut trace = SwfTrace::default();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| SimError::ReadTrace {
            path: path.to_path_buf(),
            source,
        })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix(';') {
            read_header_line(comment, &mut trace.header);
            continue;
        }
        let record = parse_record(line).map_err(|reason| SimError::ParseTrace {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        })?;
        trace.records.push(record);
    }
    Ok(trace)
}

fn read_header_line(comment: &str, header: &mut SwfHeader) {
    let Some((key, value)) = comment.split_once(':') else {
        return;
    };
    let value = value.trim();
    match key.trim() {
        "MaxProcs" => header.max_procs = value.parse().ok(),
        "MaxNodes" => header.max_nodes = value.parse().ok(),
        "UnixStartTime" => header.unix_start_time = value.parse().ok(),
        _ => {}
    }
}

fn parse_record(line: &str) -> Result<SwfRecord, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 13 {
        return Err(format!("expected 18 fields, found {}", fields.len()));
    }
    // Some archive logs write times as decimals ("123.00"); the format allows it.
    let num = |i: usize| -> Result<i64, String> {
        let f = fields[i];
        f.parse::<i64>()
            .or_else(|_| f.parse::<f64>().map(|v| v.round() as i64))
            .map_err(|_| format!("field {} is not a number: {f:?}", i + 1))
    };
    let known = |i: usize| -> Result<Option<i64>, String> {
        let v = num(i)?;
        Ok((v >= 0).then_some(v))
    };
    let opt_at = |i: usize| -> Result<Option<i64>, String> {
        if i < fields.len() { known(i) } else { Ok(None) }
    };
    let id = known(0)?.ok_or("job number is negative")? as u64;
    let submit = known(1)?.ok_or("submit time is missing")?;
    Ok(SwfRecord {
        id,
        submit,
        wait: known(2)?,
        run: known(3)?,
        alloc_procs: known(4)?.map(|v| v as u64),
        req_procs: known(7)?.map(|v| v as u64),
        req_time: known(8)?,
        status: num(10).ok().filter(|s| *s >= 0),
        user: known(11)?.map(|v| v as u32),
        group: known(12)?.map(|v| v as u32),
        queue: opt_at(14)?,
        partition: opt_at(15)?,
    })
}

/// How records become jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Cleaning {
    /// The usual rules (Feitelson and Tsafrir's advice for replays): drop
    /// records without a positive run time or a processor count, and those
    /// wider than the machine.
    Standard,
    /// RLScheduler's loader: a missing run time becomes 10 s, a run time of 0
    /// is dropped, processors = max(allocated, requested), wider-than-machine
    /// jobs dropped (RLScheduler would never start them).
    RlScheduler,
}

/// Where backfilling's run-time estimates come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Estimates {
    /// The requested time, or the run time where the trace has none.
    Requested,
    /// The actual run time (perfect estimates, RLScheduler's protocol on
    /// traces without requested times).
    Exact,
}

/// A job ready for replay. Times are trace seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimJob {
    pub id: u64,
    pub submit: i64,
    /// Actual run time, > 0.
    pub run: i64,
    /// Processors, > 0 and at most the machine's.
    pub procs: u64,
    /// What backfilling believes the run time is, > 0.
    pub estimate: i64,
    /// Trace user and group (0 when unknown): fair-share identities.
    pub user: u32,
    pub group: u32,
    /// The wait the original scheduler produced, for comparison.
    pub recorded_wait: Option<i64>,
}

/// Records dropped by [`clean`], by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Dropped {
    pub no_run_time: usize,
    pub no_procs: usize,
    pub too_wide: usize,
}

/// Turn records into jobs for a machine of `machine_procs` processors,
/// sorted by submit time then job number (the order FCFS serves them in).
pub fn clean(
    records: &[SwfRecord],
    machine_procs: u64,
    rules: Cleaning,
    estimates: Estimates,
) -> (Vec<SimJob>, Dropped) {
    let mut dropped = Dropped::default();
    let mut jobs = Vec::with_capacity(records.len());
    for r in records {
        let run = match (rules, r.run) {
            (_, Some(run)) if run > 0 => run,
            (Cleaning::RlScheduler, None) => 10,
            _ => {
                dropped.no_run_time += 1;
                continue;
            }
        };
        let procs = match rules {
            Cleaning::Standard => r.alloc_procs.filter(|p| *p > 0).or(r.req_procs),
            Cleaning::RlScheduler => r.alloc_procs.max(r.req_procs),
        };
        let Some(procs) = procs.filter(|p| *p > 0) else {
            dropped.no_procs += 1;
            continue;
        };
        if procs > machine_procs {
            dropped.too_wide += 1;
            continue;
        }
        let estimate = match estimates {
            Estimates::Exact => run,
            Estimates::Requested => r.req_time.filter(|t| *t > 0).unwrap_or(run),
        };
        jobs.push(SimJob {
            id: r.id,
            submit: r.submit,
            run,
            procs,
            estimate,
            user: r.user.unwrap_or(0),
            group: r.group.unwrap_or(0),
            recorded_wait: r.wait,
        });
    }
    jobs.sort_by_key(|j| (j.submit, j.id));
    (jobs, dropped)
}

/// A path for error messages when the trace did not come from a file.
pub fn inline_path() -> PathBuf {
    PathBuf::from("<inline>")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
; Version: 2.2
; MaxNodes: 4
; MaxProcs: 8
1 0 5 100 2 -1 -1 2 200 -1 1 7 3 -1 1 1 -1 -1
2 10 -1 -1 4 -1 -1 4 60 -1 5 8 3 -1 1 1 -1 -1
3 20 0 30 -1 -1 -1 16 60 -1 1 8 3 -1 1 1 -1 -1
4 5 0 50 -1 -1 -1 3 -1 -1 1 9 4 -1 1 1 -1 -1
5 30 0 0 1 -1 -1 1 10 -1 1 9 4 -1 1 1 -1 -1
";

    #[test]
    fn parses_header_and_missing_values() {
        let t = parse(TRACE.as_bytes(), &inline_path()).unwrap();
        assert_eq!(t.header.max_procs, Some(8));
        assert_eq!(t.header.max_nodes, Some(4));
        assert_eq!(t.header.machine_procs(), Some(8));
        assert_eq!(t.records.len(), 5);
        let r = &t.records[1];
        assert_eq!((r.id, r.submit, r.wait, r.run), (2, 10, None, None));
        assert_eq!(r.user, Some(8));
        assert_eq!(t.records[3].alloc_procs, None);
        assert_eq!(t.records[3].req_time, None);
    }

    #[test]
    fn standard_cleaning_drops_unrunnable_records() {
        let t = parse(TRACE.as_bytes(), &inline_path()).unwrap();
        let (jobs, dropped) = clean(&t.records, 8, Cleaning::Standard, Estimates::Requested);
        // 2: no run time; 3: 16 procs on an 8-proc machine; 5: run time 0.
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![1, 4]);
        assert_eq!(
            dropped,
            Dropped {
                no_run_time: 2,
                no_procs: 0,
                too_wide: 1
            }
        );
        // Job 4 has no requested time: its estimate falls back to its run time.
        assert_eq!(jobs[1].estimate, 50);
        assert_eq!(jobs[1].procs, 3);
        assert_eq!(jobs[0].estimate, 200);
    }

    #[test]
    fn rlscheduler_cleaning_keeps_missing_run_times_as_10s() {
        let t = parse(TRACE.as_bytes(), &inline_path()).unwrap();
        let (jobs, dropped) = clean(&t.records, 8, Cleaning::RlScheduler, Estimates::Exact);
        assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![1, 4, 2]);
        assert_eq!(jobs[2].run, 10);
        assert_eq!(jobs[2].estimate, 10);
        assert_eq!(dropped.no_run_time, 1);
    }

    #[test]
    fn max_nodes_stands_in_for_missing_max_procs() {
        let t = parse(
            "; MaxNodes: 256\n1 0 -1 5 1\t-1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n".as_bytes(),
            &inline_path(),
        )
        .unwrap();
        assert_eq!(t.header.machine_procs(), Some(256));
        assert_eq!(t.records[0].run, Some(5));
    }

    #[test]
    fn bad_line_names_its_number() {
        let err = parse("; x\n1 2 3\n".as_bytes(), &inline_path()).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = parse(
            "1 0 0 abc 1 -1 -1 1 1 -1 1 1 1 -1 1 1 -1 -1\n".as_bytes(),
            &inline_path(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("field 4"), "{err}");
    }

    #[test]
    fn reads_gzip_by_magic_bytes() {
        use flate2::{Compression, write::GzEncoder};
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("tandem-swf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.swf");
        let mut enc = GzEncoder::new(File::create(&path).unwrap(), Compression::fast());
        enc.write_all(TRACE.as_bytes()).unwrap();
        enc.finish().unwrap();
        let t = read(&path).unwrap();
        assert_eq!(t.records.len(), 5);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(read(&path), Err(SimError::ReadTrace { .. })));
    }
}
