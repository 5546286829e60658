//! What a pod asks for through `tandem.dev/*` annotations, parsed and checked.
//!
//! The admission webhook refuses a pod whose annotations do not parse, with the message
//! this module writes; the scheduler parses them again (pods may predate the webhook) and
//! reports the same message as `Unschedulable`. An unknown key under `tandem.dev/` is
//! refused rather than ignored: `tandem.dev/partiton: gpu` silently landing in the default
//! partition is the kind of mistake a user never finds.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::labels::{ACCOUNT, JOB_ID, PARTITION, PREFIX, QOS, TIME_LIMIT, USER_ANNOTATIONS};

/// A pod's own requests; `None` = not given (the namespace's default, then the cluster's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAsks {
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub account: Option<String>,
    /// Seconds; `Some(None)` = `UNLIMITED` (the partition's limit applies, as in Slurm).
    pub time_limit: Option<Option<u64>>,
}

/// Why a pod's annotations were refused. The message names the annotation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AnnotationError {
    #[error("annotation {key}: {problem}")]
    Invalid { key: String, problem: String },
    #[error("unknown annotation {key}: Tandem reads only {}", USER_ANNOTATIONS.join(", "))]
    Unknown { key: String },
}

/// Longest partition, QOS or account name accepted (Slurm's own limit is larger; names
/// longer than this are always a mistake in a pod manifest).
const MAX_NAME: usize = 64;

/// Parses the `tandem.dev/*` annotations of a pod. Other annotations are not looked at.
pub fn parse(annotations: Option<&BTreeMap<String, String>>) -> Result<PodAsks, AnnotationError> {
    let mut asks = PodAsks::default();
    let Some(map) = annotations else {
        return Ok(asks);
    };
    for (key, value) in map.range(PREFIX.to_owned()..) {
        if !key.starts_with(PREFIX) {
            break;
        }
        match key.as_str() {
            PARTITION => asks.partition = Some(name(key, value)?),
            QOS => asks.qos = Some(name(key, value)?),
            ACCOUNT => asks.account = Some(name(key, value)?),
            TIME_LIMIT => {
                let t = tandem_sched::time::parse_duration(value.trim()).map_err(|e| {
                    invalid(key, format!("{value:?} is not a Slurm time limit: {e}"))
                })?;
                asks.time_limit = Some(t);
            }
            // Written by the bridge itself; a copy in a pod template is harmless.
            JOB_ID => {}
            _ => return Err(AnnotationError::Unknown { key: key.clone() }),
        }
    }
    Ok(asks)
}

/// A partition, QOS or account name: what Slurm's tools accept without quoting.
fn name(key: &str, value: &str) -> Result<String, AnnotationError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(invalid(key, "empty".to_owned()));
    }
    if v.len() > MAX_NAME {
        return Err(invalid(key, format!("longer than {MAX_NAME} characters")));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(invalid(
            key,
            format!("{v:?} contains {c:?}; names use letters, digits, '_', '-' and '.'"),
        ));
    }
    Ok(v.to_owned())
}

fn invalid(key: &str, problem: String) -> AnnotationError {
    AnnotationError::Invalid {
        key: key.to_owned(),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(pairs: &[(&str, &str)]) -> Result<PodAsks, AnnotationError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        parse(Some(&map))
    }

    #[test]
    fn reads_every_user_annotation_and_ignores_foreign_ones() {
        let a = asks(&[
            (PARTITION, "gpu"),
            (QOS, "high"),
            (ACCOUNT, "team-a"),
            (TIME_LIMIT, "1-02:00:00"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
            ("tandem.devx/other", "x"),
        ])
        .unwrap();
        assert_eq!(a.partition.as_deref(), Some("gpu"));
        assert_eq!(a.qos.as_deref(), Some("high"));
        assert_eq!(a.account.as_deref(), Some("team-a"));
        assert_eq!(a.time_limit, Some(Some(26 * 3600)));
        assert_eq!(parse(None).unwrap(), PodAsks::default());
    }

    #[test]
    fn time_limits_take_every_slurm_spelling() {
        for (text, want) in [
            ("30", Some(1800)),
            ("10:30", Some(630)),
            ("2-0", Some(2 * 86_400)),
            ("UNLIMITED", None),
            ("infinite", None),
        ] {
            assert_eq!(
                asks(&[(TIME_LIMIT, text)]).unwrap().time_limit,
                Some(want),
                "{text}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let e = asks(&[(TIME_LIMIT, "soon")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("annotation tandem.dev/time-limit:"),
            "{e}"
        );
        let e = asks(&[(PARTITION, "")]).unwrap_err();
        assert_eq!(e.to_string(), "annotation tandem.dev/partition: empty");
        let e = asks(&[(ACCOUNT, "a,b")]).unwrap_err();
        assert!(e.to_string().contains("contains ','"), "{e}");
        let e = asks(&[(QOS, &"q".repeat(65))]).unwrap_err();
        assert!(e.to_string().contains("longer than 64"), "{e}");
    }

    #[test]
    fn a_typo_under_the_prefix_is_refused() {
        let e = asks(&[("tandem.dev/partiton", "gpu")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown annotation tandem.dev/partiton: Tandem reads only tandem.dev/partition, \
             tandem.dev/qos, tandem.dev/account, tandem.dev/time-limit"
        );
        // The bridge's own annotation, copied into a template, is not a typo.
        assert!(asks(&[(JOB_ID, "12")]).is_ok());
    }
}
