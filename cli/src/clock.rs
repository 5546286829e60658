//! The wall clock and the user's time zone: the only place the CLI reads them, so everything
//! else takes `now` and an offset as arguments.

/// Unix seconds now.
pub fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Offset of the local time zone from UTC now, in seconds (0 if the zone is unknown).
pub fn local_utc_offset() -> i32 {
    let tz = jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC);
    tz.to_offset(jiff::Timestamp::now()).seconds()
}
