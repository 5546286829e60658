//! The wall clock: Unix seconds.
//!
//! The leftmost layer of the crate (see the crate documentation): the CA dates its
//! certificates by it and the credentials their `iat` and `exp`, so it sits below both.

/// Unix seconds now: the wall clock of credentials (`iat`, `exp`) and of every time the
/// daemons put on the wire or in records (start, end, heartbeat, boot). The workspace's one
/// such helper; the scheduling core (`tandem-sched`) reads no clock, its callers pass this.
/// 0 before 1970, `i64::MAX` past what `i64` holds.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
