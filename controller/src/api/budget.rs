//! How much CPU listings may take over time: a token bucket filled in CPU-seconds.
//!
//! Running listings at the lowest priority ([`crate::idle`]) keeps them off a core the
//! actor or the committer wants at that instant, but not off the machine: a crowd looping
//! `squeue` over a long queue keeps the listing threads busy on every core left idle, and
//! with them the async workers that write the replies and the crowd's own decoding. On a
//! small controller that shared hardware is what submits lose (`benches/squeue_load.rs`: an
//! idle-priority busy loop alone cost the submitter 8-25 % on the 2-core machine). So the
//! listing threads spend from a bucket that fills at `rate` CPU-seconds per second and holds
//! at most `burst`: a user's occasional `squeue` or `watch squeue`, even over 100,000 jobs,
//! never waits; a crowd gets `rate` between them and waits its turn, as Slurm's RPC rate
//! limiting (`rl_enable`) and Kubernetes' API priority and fairness queue a flood of lists
//! rather than serve it at everyone else's expense.

use std::time::{Duration, Instant};

/// The listing threads' CPU allowance.
#[derive(Debug, Clone)]
pub struct CpuBudget {
    /// CPU-seconds added per second of wall time.
    rate: f64,
    /// Most CPU-seconds saved up.
    burst: f64,
    /// CPU-seconds available now; below zero after a listing overspent.
    tokens: f64,
    filled_at: Instant,
}

impl CpuBudget {
    /// A full bucket: `rate` CPU-seconds per second (above zero), at most `burst` saved.
    pub fn new(rate: f64, burst: Duration, now: Instant) -> Self {
        let burst = burst.as_secs_f64();
        Self {
            rate: rate.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            filled_at: now,
        }
    }

    fn fill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.filled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.filled_at = self.filled_at.max(now);
    }

    /// Records `used` CPU time of a listing that ended at `now`.
    pub fn charge(&mut self, used: Duration, now: Instant) {
        self.fill(now);
        self.tokens -= used.as_secs_f64();
    }

    /// How long the next listing must wait at `now` (zero while anything is left).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.fill(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_runs_without_waiting() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(0.25, Duration::from_secs(2), t0);
        // Thirteen listings of 150 ms CPU back to back: 1.95 s, within the burst.
        let mut now = t0;
        for _ in 0..13 {
            assert_eq!(b.wait(now), Duration::ZERO);
            now += 150 * MS;
            b.charge(150 * MS, now);
        }
        assert_eq!(b.wait(now), Duration::ZERO);
    }

    #[test]
    fn a_crowd_gets_the_rate() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(0.25, Duration::from_secs(2), t0);
        let mut now = t0;
        let mut cpu = Duration::ZERO;
        // Listings of 150 ms CPU as fast as the budget lets them start, for 60 s.
        while now < t0 + Duration::from_secs(60) {
            now += b.wait(now);
            now += 150 * MS;
            b.charge(150 * MS, now);
            cpu += 150 * MS;
        }
        let share = cpu.as_secs_f64() / (now - t0).as_secs_f64();
        // The rate plus the first burst spread over the minute, and one listing of slack.
        assert!(share <= 0.25 + 2.0 / 60.0 + 0.01, "share {share}");
        assert!(share >= 0.25, "share {share}");
    }

    #[test]
    fn an_overspent_bucket_waits_for_the_debt_to_refill() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(0.5, Duration::from_secs(1), t0);
        b.charge(Duration::from_secs(2), t0);
        // One second in debt at half a CPU-second per second.
        assert_eq!(b.wait(t0), Duration::from_secs(2));
        assert_eq!(b.wait(t0 + Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(b.wait(t0 + Duration::from_secs(2)), Duration::ZERO);
    }

    #[test]
    fn idle_time_saves_no_more_than_the_burst() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(1.0, Duration::from_secs(1), t0);
        let later = t0 + Duration::from_secs(3600);
        b.charge(Duration::from_millis(1500), later);
        assert_eq!(b.wait(later), Duration::from_millis(500));
    }

    #[test]
    fn a_clock_read_out_of_order_takes_nothing_back() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(1.0, Duration::from_secs(1), t0 + Duration::from_secs(1));
        b.charge(Duration::from_secs(1), t0);
        assert_eq!(b.wait(t0 + Duration::from_secs(1)), Duration::ZERO);
    }
}
