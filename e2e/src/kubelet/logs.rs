//! Container logs: captured in the CRI log format and served over HTTP like the kubelet's
//! `/containerLogs/{namespace}/{pod}/{container}` endpoint, which the API server's
//! `pods/{name}/log` subresource proxies to (see /tmp/e2e-api.md and DIFFERENCES.md).
//!
//! Each container instance (each restart) gets one file, so `previous=true` can serve the
//! instance before the current one. A line is stored as `<RFC3339 time> <stream> <F|P> <text>`
//! (CRI: `P` marks a partial line that continues in the next record), which is what makes
//! `timestamps`, `sinceSeconds`/`sinceTime` and `tailLines` possible.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

/// Longest record written as one line; longer output is split into partial (`P`) records.
const MAX_RECORD: usize = 16 * 1024;

// === pure: the record format and the query ===

/// One stored log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub time: Timestamp,
    pub stream: String,
    /// A partial line, continued by the next record of the same stream.
    pub partial: bool,
    pub text: String,
}

impl Record {
    pub fn encode(&self) -> String {
        let tag = if self.partial { "P" } else { "F" };
        format!("{} {} {tag} {}\n", self.time, self.stream, self.text)
    }

    pub fn decode(line: &str) -> Option<Self> {
        let mut parts = line.trim_end_matches('\n').splitn(4, ' ');
        let time = parts.next()?.parse().ok()?;
        let stream = parts.next()?.to_owned();
        let partial = match parts.next()? {
            "P" => true,
            "F" => false,
            _ => return None,
        };
        Some(Self {
            time,
            stream,
            partial,
            text: parts.next().unwrap_or("").to_owned(),
        })
    }

    /// The bytes a log reader sees for this record.
    fn render(&self, timestamps: bool) -> String {
        let mut out = String::new();
        if timestamps {
            out.push_str(&self.time.to_string());
            out.push(' ');
        }
        out.push_str(&self.text);
        if !self.partial {
            out.push('\n');
        }
        out
    }
}

/// The query of a log request (the fields of `PodLogOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
    /// Only records at or after this time (from `sinceSeconds` or `sinceTime`).
    pub since: Option<Timestamp>,
}

impl LogQuery {
    /// Parses query parameters; a bad value is a one-line error for a 400 answer.
    pub fn parse(params: &HashMap<String, String>, now: Timestamp) -> Result<Self, String> {
        let flag = |name: &str| match params.get(name).map(String::as_str) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(other) => Err(format!("invalid {name}: {other:?} is not a boolean")),
        };
        let number = |name: &str| -> Result<Option<i64>, String> {
            params
                .get(name)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| format!("invalid {name}: {v:?} is not an integer"))
                })
                .transpose()
        };
        let non_negative = |name: &str| -> Result<Option<usize>, String> {
            match number(name)? {
                Some(n) if n < 0 => Err(format!("invalid {name}: must be non-negative")),
                other => Ok(other.map(|n| n as usize)),
            }
        };
        let since = match (number("sinceSeconds")?, params.get("sinceTime")) {
            (Some(_), Some(_)) => {
                return Err("at most one of sinceTime or sinceSeconds may be specified".into());
            }
            (Some(s), None) if s < 1 => {
                return Err("invalid sinceSeconds: must be greater than 0".into());
            }
            (Some(s), None) => Some(now - k8s_openapi::jiff::SignedDuration::from_secs(s)),
            (None, Some(t)) => Some(
                t.parse()
                    .map_err(|_| format!("invalid sinceTime: {t:?} is not RFC 3339"))?,
            ),
            (None, None) => None,
        };
        Ok(Self {
            follow: flag("follow")?,
            previous: flag("previous")?,
            timestamps: flag("timestamps")?,
            tail_lines: non_negative("tailLines")?,
            limit_bytes: non_negative("limitBytes")?,
            since,
        })
    }

    fn keeps(&self, r: &Record) -> bool {
        self.since.is_none_or(|since| r.time >= since)
    }
}

/// Renders stored records for a query (the part that is not following).
pub fn render(records: &[Record], q: &LogQuery) -> String {
    let kept: Vec<&Record> = records.iter().filter(|r| q.keeps(r)).collect();
    let start = match q.tail_lines {
        None => 0,
        Some(n) => {
            // Count whole lines from the end; a line's partial records travel with it.
            let mut lines = 0;
            let mut start = kept.len();
            for (i, r) in kept.iter().enumerate().rev() {
                if !r.partial {
                    if lines == n {
                        break;
                    }
                    lines += 1;
                }
                start = i;
            }
            start
        }
    };
    kept[start..]
        .iter()
        .map(|r| r.render(q.timestamps))
        .collect()
}

// === the store ===

/// Progress of one container instance's log: bytes written so far, and whether the
/// process's output has closed (so a follower can stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub written: u64,
    pub done: bool,
}

#[derive(Debug, Clone)]
struct Instance {
    path: PathBuf,
    progress: watch::Receiver<Progress>,
}

#[derive(Debug)]
struct PodLogs {
    uid: String,
    dir: PathBuf,
    /// Container names from the spec, in order (for "which container?" answers).
    names: Vec<String>,
    instances: HashMap<String, Vec<Instance>>,
}

/// Every pod's logs on this kubelet, keyed by (namespace, pod name).
#[derive(Debug)]
pub struct LogStore {
    root: PathBuf,
    pods: Mutex<HashMap<(String, String), PodLogs>>,
}

/// Why a log request cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError {
    pub code: StatusCode,
    pub message: String,
}

impl LogStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// Makes a pod's containers known (before any of them starts).
    pub fn register_pod(&self, ns: &str, pod: &str, uid: &str, names: Vec<String>) {
        let dir = self.root.join(format!("{ns}_{pod}_{uid}"));
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.insert(
            (ns.to_owned(), pod.to_owned()),
            PodLogs {
                uid: uid.to_owned(),
                dir,
                names,
                instances: HashMap::new(),
            },
        );
    }

    /// Forgets a pod and deletes its files (when the pod is removed from the API).
    pub fn remove_pod(&self, ns: &str, pod: &str, uid: &str) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let key = (ns.to_owned(), pod.to_owned());
        if pods.get(&key).is_some_and(|p| p.uid == uid)
            && let Some(p) = pods.remove(&key)
        {
            let _ = std::fs::remove_dir_all(&p.dir);
        }
    }

    /// Opens the log file of a new container instance and captures `stdout`/`stderr` into
    /// it until both close. The returned task ends when the output is all written.
    pub async fn capture(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        stdout: impl AsyncRead + Unpin + Send + 'static,
        stderr: impl AsyncRead + Unpin + Send + 'static,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let (path, tx) = {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            let Some(p) = pods.get_mut(&(ns.to_owned(), pod.to_owned())) else {
                return Err(std::io::Error::other(format!(
                    "pod {ns}/{pod} is not registered"
                )));
            };
            let list = p.instances.entry(container.to_owned()).or_default();
            let path = p.dir.join(container).join(format!("{}.log", list.len()));
            let (tx, rx) = watch::channel(Progress::default());
            list.push(Instance {
                path: path.clone(),
                progress: rx,
            });
            (path, tx)
        };
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let file = tokio::fs::File::create(&path).await?;
        let sink = Arc::new(tokio::sync::Mutex::new((file, tx)));
        let out = tokio::spawn(copy_stream(stdout, "stdout", sink.clone()));
        let err = tokio::spawn(copy_stream(stderr, "stderr", sink.clone()));
        Ok(tokio::spawn(async move {
            let _ = out.await;
            let _ = err.await;
            let guard = sink.lock().await;
            guard.1.send_modify(|p| p.done = true);
        }))
    }

    fn instance(
        &self,
        ns: &str,
        pod: &str,
        container: Option<&str>,
        previous: bool,
    ) -> Result<Instance, LogError> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let not_found = |message: String| LogError {
            code: StatusCode::NOT_FOUND,
            message,
        };
        let bad = |message: String| LogError {
            code: StatusCode::BAD_REQUEST,
            message,
        };
        let p = pods
            .get(&(ns.to_owned(), pod.to_owned()))
            .ok_or_else(|| not_found(format!("pod {ns}/{pod} is not known to this kubelet")))?;
        let name = match container {
            Some(c) if !c.is_empty() => c.to_owned(),
            _ if p.names.len() == 1 => p.names[0].clone(),
            _ => {
                return Err(bad(format!(
                    "a container name must be specified for pod {pod}, choose one of: [{}]",
                    p.names.join(" ")
                )));
            }
        };
        if !p.names.contains(&name) {
            return Err(bad(format!("container {name} is not valid for pod {pod}")));
        }
        let list = p
            .instances
            .get(&name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let pick = if previous {
            list.len().checked_sub(2)
        } else {
            list.len().checked_sub(1)
        };
        match pick {
            Some(i) => Ok(list[i].clone()),
            None if previous => Err(bad(format!(
                "previous terminated container \"{name}\" in pod \"{pod}\" not found"
            ))),
            None => Err(bad(format!(
                "container \"{name}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
            ))),
        }
    }

    /// Answers a log request: the rendered log, streamed on while following.
    pub async fn read(
        self: &Arc<Self>,
        ns: &str,
        pod: &str,
        container: Option<&str>,
        q: LogQuery,
    ) -> Result<Body, LogError> {
        let inst = self.instance(ns, pod, container, q.previous)?;
        let io = |e: std::io::Error| LogError {
            code: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("reading {}: {e}", inst.path.display()),
        };
        let mut progress = inst.progress.clone();
        let snapshot = *progress.borrow_and_update();
        let bytes = read_from(&inst.path, 0, snapshot.written)
            .await
            .map_err(io)?;
        let records: Vec<Record> = String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(Record::decode)
            .collect();
        let mut budget = q.limit_bytes.unwrap_or(usize::MAX);
        let first = clip(render(&records, &q), &mut budget);
        if !q.follow || snapshot.done || budget == 0 {
            return Ok(Body::from(first));
        }
        // Follow: wait for the writer to report progress, then send what was added.
        let path = inst.path.clone();
        let state = (path, snapshot.written, progress, q, budget, Some(first));
        let stream = futures::stream::unfold(
            state,
            |(path, offset, mut progress, q, mut budget, first)| async move {
                if let Some(first) = first {
                    return Some((
                        Ok::<_, std::io::Error>(first),
                        (path, offset, progress, q, budget, None),
                    ));
                }
                loop {
                    if budget == 0 {
                        return None;
                    }
                    let now = *progress.borrow_and_update();
                    if now.written > offset {
                        let bytes = match read_from(&path, offset, now.written).await {
                            Ok(b) => b,
                            Err(e) => return Some((Err(e), (path, offset, progress, q, 0, None))),
                        };
                        let records: Vec<Record> = String::from_utf8_lossy(&bytes)
                            .lines()
                            .filter_map(Record::decode)
                            .collect();
                        let chunk = clip(
                            render(
                                &records,
                                &LogQuery {
                                    tail_lines: None,
                                    ..q.clone()
                                },
                            ),
                            &mut budget,
                        );
                        return Some((Ok(chunk), (path, now.written, progress, q, budget, None)));
                    }
                    if now.done || progress.changed().await.is_err() {
                        return None;
                    }
                }
            },
        );
        Ok(Body::from_stream(stream))
    }
}

fn clip(mut s: String, budget: &mut usize) -> String {
    if s.len() > *budget {
        let mut cut = *budget;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    *budget -= s.len();
    s
}

/// Reads `[from, to)` of a file: only whole records, since `to` is a record boundary.
async fn read_from(path: &Path, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(std::io::SeekFrom::Start(from)).await?;
    let mut buf = vec![0; (to - from) as usize];
    file.read_exact(&mut buf).await?;
    Ok(buf)
}

type Sink = Arc<tokio::sync::Mutex<(tokio::fs::File, watch::Sender<Progress>)>>;

/// Copies one output stream into the log as records, splitting over-long lines.
async fn copy_stream(reader: impl AsyncRead + Unpin, stream: &'static str, sink: Sink) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut reader)
            .take(MAX_RECORD as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let complete = buf.ends_with(b"\n");
        let text = String::from_utf8_lossy(if complete { &buf[..n - 1] } else { &buf[..] });
        // A record line must not contain a newline of its own; CR is kept as text.
        let record = Record {
            time: Timestamp::now(),
            stream: stream.into(),
            partial: !complete,
            text: text.into_owned(),
        };
        let line = record.encode();
        let mut guard = sink.lock().await;
        let (file, tx) = &mut *guard;
        if file.write_all(line.as_bytes()).await.is_err() || file.flush().await.is_err() {
            return;
        }
        tx.send_modify(|p| p.written += line.len() as u64);
    }
}

// === HTTP ===

/// The kubelet's log endpoint as an axum router.
pub fn router(store: Arc<LogStore>) -> axum::Router {
    axum::Router::new()
        .route(
            "/containerLogs/{ns}/{pod}/{container}",
            axum::routing::get(with_container),
        )
        .route(
            "/containerLogs/{ns}/{pod}",
            axum::routing::get(without_container),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .with_state(store)
}

async fn with_container(
    State(store): State<Arc<LogStore>>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    serve(store, ns, pod, Some(container), params).await
}

async fn without_container(
    State(store): State<Arc<LogStore>>,
    UrlPath((ns, pod)): UrlPath<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let container = params.get("container").cloned();
    serve(store, ns, pod, container, params).await
}

async fn serve(
    store: Arc<LogStore>,
    ns: String,
    pod: String,
    container: Option<String>,
    params: HashMap<String, String>,
) -> Response {
    let q = match LogQuery::parse(&params, Timestamp::now()) {
        Ok(q) => q,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    match store.read(&ns, &pod, container.as_deref(), q).await {
        Ok(body) => ([(header::CONTENT_TYPE, "text/plain")], body).into_response(),
        Err(e) => (e.code, e.message).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(secs: i64, text: &str, partial: bool) -> Record {
        Record {
            time: Timestamp::from_second(1_800_000_000 + secs).unwrap(),
            stream: "stdout".into(),
            partial,
            text: text.into(),
        }
    }

    #[test]
    fn records_round_trip_including_spaces() {
        let r = rec(1, "a b  c", true);
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode("garbage"), None);
    }

    #[test]
    fn render_tails_whole_lines_and_filters_by_time() {
        let records = vec![
            rec(1, "one", false),
            rec(2, "tw", true),
            rec(3, "o", false),
            rec(4, "three", false),
        ];
        let all = LogQuery::default();
        assert_eq!(render(&records, &all), "one\ntwo\nthree\n");
        let tail = LogQuery {
            tail_lines: Some(2),
            ..LogQuery::default()
        };
        assert_eq!(render(&records, &tail), "two\nthree\n");
        let none = LogQuery {
            tail_lines: Some(0),
            ..LogQuery::default()
        };
        assert_eq!(render(&records, &none), "");
        let since = LogQuery {
            since: Some(records[3].time),
            ..LogQuery::default()
        };
        assert_eq!(render(&records, &since), "three\n");
        let ts = LogQuery {
            timestamps: true,
            tail_lines: Some(1),
            ..LogQuery::default()
        };
        assert_eq!(
            render(&records, &ts),
            format!("{} three\n", records[3].time)
        );
    }

    #[test]
    fn query_parsing_rejects_bad_values() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let p = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            LogQuery::parse(&m, now)
        };
        let q = p(&[
            ("follow", "true"),
            ("tailLines", "5"),
            ("sinceSeconds", "10"),
        ])
        .unwrap();
        assert!(q.follow && q.tail_lines == Some(5));
        assert_eq!(
            q.since,
            Some(Timestamp::from_second(1_800_000_000 - 10).unwrap())
        );
        assert!(p(&[("tailLines", "x")]).is_err());
        assert!(p(&[("limitBytes", "-1")]).is_err());
        assert!(p(&[("follow", "maybe")]).is_err());
        assert!(p(&[("sinceSeconds", "1"), ("sinceTime", "2020-01-01T00:00:00Z")]).is_err());
    }

    #[tokio::test]
    async fn capture_then_read_previous_and_current() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LogStore::new(dir.path()));
        store.register_pod("ns", "p", "u", vec!["c".into()]);
        for text in ["first\n", "second\nno newline"] {
            let task = store
                .capture("ns", "p", "c", text.as_bytes(), &b""[..])
                .await
                .unwrap();
            task.await.unwrap();
        }
        assert!(
            store
                .instance("ns", "p", None, false)
                .unwrap()
                .progress
                .borrow()
                .done
        );
        let read = |previous| {
            let store = store.clone();
            async move {
                let body = store
                    .read(
                        "ns",
                        "p",
                        None,
                        LogQuery {
                            previous,
                            ..LogQuery::default()
                        },
                    )
                    .await
                    .unwrap();
                let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                String::from_utf8(bytes.to_vec()).unwrap()
            }
        };
        assert_eq!(read(true).await, "first\n");
        assert_eq!(read(false).await, "second\nno newline");
        let err = store
            .read("ns", "p", Some("x"), LogQuery::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.code, StatusCode::BAD_REQUEST);
        let err = store
            .read("ns", "q", None, LogQuery::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.code, StatusCode::NOT_FOUND);
    }
}
