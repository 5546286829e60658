//! The controller's Prometheus endpoint as a scraper sees it, the exposition checked
//! against the OpenMetrics text format on every scrape.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A free loopback port (bound, read, released: the controller binds it right after).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// GET /metrics, checked line by line against the OpenMetrics text format: every sample
/// belongs to a family declared by `# TYPE` (with its type's suffixes), label values are
/// quoted, values are numbers, the body ends with `# EOF`. Returns `name{labels}` -> value.
pub async fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: tandem\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    parse_openmetrics(body)
}

/// Scrapes until `key` reads `want` (gauges follow passes within a fraction of a second).
pub async fn scrape_until(addr: SocketAddr, key: &str, want: f64) -> BTreeMap<String, f64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = scrape(addr).await;
        if m.get(key) == Some(&want) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} is {:?}, want {want}: {m:?}",
            m.get(key)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn parse_openmetrics(body: &str) -> BTreeMap<String, f64> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut out = BTreeMap::new();
    let mut saw_eof = false;
    for l in body.lines() {
        assert!(!saw_eof, "text after # EOF: {l:?}");
        if l == "# EOF" {
            saw_eof = true;
            continue;
        }
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
            assert!(
                [
                    "gauge",
                    "counter",
                    "histogram",
                    "unknown",
                    "info",
                    "stateset"
                ]
                .contains(&ty),
                "{l}"
            );
            types.insert(name.to_owned(), ty.to_owned());
            continue;
        }
        if l.starts_with("# HELP ") || l.starts_with("# UNIT ") {
            continue;
        }
        assert!(!l.starts_with('#'), "unknown comment {l:?}");
        let (series, value) = l.rsplit_once(' ').expect("sample: series value");
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?} of {series}")),
        };
        let name = match series.split_once('{') {
            None => series,
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("closing brace");
                for pair in labels.split(',') {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    assert!(
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                        "label name {k:?}"
                    );
                    assert!(
                        v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                        "label value {v:?}"
                    );
                }
                name
            }
        };
        let family = types.iter().find(|(f, ty)| {
            let suffixes: &[&str] = match ty.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name == format!("{f}{s}"))
        });
        assert!(family.is_some(), "sample {name} has no # TYPE");
        assert!(
            out.insert(series.to_owned(), v).is_none(),
            "duplicate {series}"
        );
    }
    assert!(saw_eof, "no # EOF");
    out
}
