//! The wall clock and the user's time zone: the only place the CLI reads them, so everything
//! else takes `now` and an offset as arguments.

use jiff::tz::TimeZone;

/// Where the system's local zone lives on Unix (the `TZif` file or a link to one).
const LOCALTIME: &str = "/etc/localtime";

/// Unix seconds now.
pub fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Offset of the local time zone from UTC now, in seconds (0 if the zone is unknown).
pub fn local_utc_offset() -> i32 {
    local_zone().to_offset(jiff::Timestamp::now()).seconds()
}

/// The first line of `squeue -l` and `sinfo -l`: the time of the listing, as Slurm prints
/// it (`Fri Dec 04 05:26:09 2026`), in the local zone.
pub fn long_listing_time(now: i64) -> String {
    listing_time_in(now, &local_zone())
}

fn listing_time_in(now: i64, zone: &TimeZone) -> String {
    jiff::Timestamp::from_second(now)
        .map(|t| {
            t.to_zoned(zone.clone())
                .strftime("%a %b %d %H:%M:%S %Y")
                .to_string()
        })
        .unwrap_or_default()
}

/// The local time zone.
///
/// jiff's `TimeZone::try_system` names the zone by looking the target of `/etc/localtime` up
/// in its zoneinfo database, and building that database lists every directory under
/// `/usr/share/zoneinfo`: about 0.4 ms, a tenth of an `sbatch` round trip, for a name the
/// CLI never prints. The rules in the file itself give the same offsets. With `$TZ` set, jiff
/// resolves it (IANA names, POSIX strings), as before.
fn local_zone() -> TimeZone {
    if std::env::var_os("TZ").is_none()
        && let Ok(data) = std::fs::read(LOCALTIME)
        && let Ok(tz) = TimeZone::tzif("Local", &data)
    {
        return tz;
    }
    TimeZone::try_system().unwrap_or(TimeZone::UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_time_reads_as_slurms() {
        let utc = TimeZone::UTC;
        assert_eq!(
            listing_time_in(1_796_361_969, &utc),
            "Fri Dec 04 05:26:09 2026"
        );
        let east = TimeZone::fixed(jiff::tz::offset(2));
        assert_eq!(listing_time_in(0, &east), "Thu Jan 01 02:00:00 1970");
    }

    #[test]
    fn local_offset_matches_jiffs_system_zone() {
        // The shortcut must agree with jiff's full resolution of the same zone.
        let want = TimeZone::try_system()
            .unwrap_or(TimeZone::UTC)
            .to_offset(jiff::Timestamp::now())
            .seconds();
        assert_eq!(local_utc_offset(), want);
    }
}
