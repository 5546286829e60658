//! Job ends on their way to the controller: nothing acknowledged as ended may be lost.
//!
//! The link has no per-message acknowledgement, so a `JobEnded` written to a stream that
//! breaks soon after may or may not have been committed by the controller. The outbox keeps
//! each end *in flight* until the stream that carried it has stayed up for
//! [`CONFIRM_AFTER`]; if the stream breaks first, the end goes back to *unsent* and is
//! reported again in the next `Register` (`ended_while_disconnected`). The controller commits
//! an end within milliseconds and treats a repeated end of a finished job as a no-op, so
//! re-sending is safe and the window only needs to outlast a crash between receipt and commit,
//! which always breaks the stream.
//!
//! Pure: time is an argument.

use std::collections::BTreeMap;
use std::time::Duration;

use tandem_proto::v1::JobEnded;
use tokio::time::Instant;

/// How long a stream must survive a `JobEnded` before the end counts as delivered.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct Outbox {
    /// Ends not yet written to a live stream, by job id (a job ends once).
    unsent: BTreeMap<u64, JobEnded>,
    /// Ends written to the current stream, with when.
    in_flight: Vec<(Instant, JobEnded)>,
}

impl Outbox {
    /// Records a new end; it will go out with the next [`Outbox::take_unsent`].
    pub fn push(&mut self, ended: JobEnded) {
        self.unsent.insert(ended.job_id, ended);
    }

    /// Everything not yet written, now considered written at `now`.
    pub fn take_unsent(&mut self, now: Instant) -> Vec<JobEnded> {
        let out: Vec<JobEnded> = std::mem::take(&mut self.unsent).into_values().collect();
        self.in_flight.extend(out.iter().cloned().map(|e| (now, e)));
        out
    }

    /// The stream broke: whatever it carried recently may not have arrived.
    pub fn link_lost(&mut self) {
        for (_, e) in self.in_flight.drain(..) {
            self.unsent.insert(e.job_id, e);
        }
    }

    /// Forgets ends whose stream has stayed up long enough; returns their job ids.
    pub fn confirm(&mut self, now: Instant) -> Vec<u64> {
        let mut done = Vec::new();
        self.in_flight.retain(|(sent, e)| {
            let keep = now.saturating_duration_since(*sent) < CONFIRM_AFTER;
            if !keep {
                done.push(e.job_id);
            }
            keep
        });
        done
    }

    /// Ends not yet known to be delivered (unsent or in flight).
    pub fn pending(&self) -> usize {
        self.unsent.len() + self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(job_id: u64) -> JobEnded {
        JobEnded {
            job_id,
            exit_code: 3,
            ..Default::default()
        }
    }

    fn ids(v: &[JobEnded]) -> Vec<u64> {
        v.iter().map(|e| e.job_id).collect()
    }

    #[test]
    fn ends_go_out_once_on_a_healthy_link() {
        let t0 = Instant::now();
        let mut o = Outbox::default();
        o.push(end(2));
        o.push(end(1));
        assert_eq!(ids(&o.take_unsent(t0)), [1, 2]);
        assert!(o.take_unsent(t0).is_empty());
        assert_eq!(o.confirm(t0 + CONFIRM_AFTER), [1, 2]);
        assert_eq!(o.pending(), 0);
    }

    #[test]
    fn an_end_sent_just_before_the_link_broke_is_sent_again() {
        let t0 = Instant::now();
        let mut o = Outbox::default();
        o.push(end(7));
        assert_eq!(ids(&o.take_unsent(t0)), [7]);
        assert!(o.confirm(t0 + Duration::from_secs(1)).is_empty());
        o.link_lost();
        let again = o.take_unsent(t0 + Duration::from_secs(2));
        assert_eq!(again, vec![end(7)], "the full record is re-sent");
    }

    #[test]
    fn confirmed_ends_are_not_resent_after_a_later_break() {
        let t0 = Instant::now();
        let mut o = Outbox::default();
        o.push(end(1));
        o.take_unsent(t0);
        o.confirm(t0 + CONFIRM_AFTER + Duration::from_secs(1));
        o.push(end(2));
        o.take_unsent(t0 + CONFIRM_AFTER + Duration::from_secs(1));
        o.link_lost();
        assert_eq!(ids(&o.take_unsent(t0 + 2 * CONFIRM_AFTER)), [2]);
    }

    #[test]
    fn ends_queued_while_disconnected_accumulate() {
        let t0 = Instant::now();
        let mut o = Outbox::default();
        o.link_lost();
        o.push(end(5));
        o.push(end(4));
        o.push(end(5));
        assert_eq!(o.pending(), 2, "a job ends once");
        assert_eq!(ids(&o.take_unsent(t0)), [4, 5]);
    }
}
