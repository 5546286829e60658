//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection`
//! does it: the bridge runs as two replicas and only the Lease's holder runs the scheduler
//! loop, so no pod is ever decided by two schedulers at once.
//!
//! ```text
//!   standby ──(Lease free, or its holder silent for leaseDurationSeconds)──▶ leader
//!   leader  ──(renewed every retry period; SIGTERM releases the Lease)──▶ standby takes over
//!   leader  ──(not renewed within the renew deadline, or another holder seen)──▶ exits
//! ```
//!
//! The decision ([`decide`]) is a pure function of the Lease as read, when this replica
//! first saw that version of it, its own identity and the clock; the I/O around it
//! ([`Elector`]) writes with optimistic concurrency: every replace carries the
//! resourceVersion read, so of two candidates racing for a free Lease the API server lets
//! exactly one win and answers the other 409.
//!
//! # Invariants
//!
//! - Another holder's term is measured from the moment this replica *saw* the record change
//!   (its own monotonic clock), never from the holder's `renewTime`: the replicas' wall
//!   clocks need not agree (client-go's `observedTime`).
//! - A leader that has not renewed within [`Timing::renew_deadline`] (shorter than the
//!   lease duration) stops at once: [`run_elected`] drops the work and returns
//!   [`Error::Lost`], so the process exits and restarts clean. A standby takes over no
//!   sooner than a full lease duration after it last saw a renewal, so the two never
//!   schedule at the same time.
//! - A leader that finds another holder in the Lease has lost, whatever the times say.
//!
//! # Timing
//!
//! With the default 10 s lease a standby re-reads the Lease every 2 s and wakes exactly when
//! the term it observed runs out, so it takes over at most `10 s + 2 s` (the lag before it
//! sees the last renewal) after the leader's death; a released Lease (SIGTERM) is taken
//! within one retry period.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{debug, info, warn};

/// Where the in-cluster service account's namespace is mounted.
pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
/// The Lease's name unless `--lease-name` says otherwise.
pub const DEFAULT_LEASE_NAME: &str = "tandem-bridge";
/// kube-scheduler's retry period; also how often a leader renews.
const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// How long a release may take on the way out before the process exits anyway (the
/// standby then waits out the term instead).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leadership of Lease {namespace}/{name} lost: {why}")]
    Lost {
        namespace: String,
        name: String,
        why: String,
    },
    #[error("lease duration of {0} s is too short (at least 2 s)")]
    TooShort(u32),
}

/// The three durations of client-go's election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a holder's term lasts after a candidate saw its last renewal; written to
    /// the Lease as `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal. Shorter than the lease
    /// duration, so the leader has stopped before any standby may take over.
    pub renew_deadline: Duration,
    /// How often a leader renews and a standby reads the Lease.
    pub retry_period: Duration,
}

impl Timing {
    /// The timing for a lease of `seconds`: renew deadline at 70% of it (kube-scheduler's
    /// 10 s of 15 s, rounded down), retry every 2 s or a fifth of the lease if shorter.
    pub fn for_lease_seconds(seconds: u32) -> Result<Self, Error> {
        if seconds < 2 {
            return Err(Error::TooShort(seconds));
        }
        let lease_duration = Duration::from_secs(u64::from(seconds));
        Ok(Self {
            lease_duration,
            renew_deadline: lease_duration * 7 / 10,
            retry_period: RETRY_PERIOD.min(lease_duration / 5),
        })
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry_period: RETRY_PERIOD,
        }
    }
}

// === the pure decision ===

/// A version of the Lease's spec and when this replica first saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub spec: LeaseSpec,
    pub at: Instant,
}

/// Records what was read: the same spec as before keeps its first sighting (a silent
/// holder's term keeps running down); a changed one starts a new term at `now`.
pub fn observe(prev: Option<Seen>, spec: &LeaseSpec, now: Instant) -> Seen {
    match prev {
        Some(s) if s.spec == *spec => s,
        _ => Seen {
            spec: spec.clone(),
            at: now,
        },
    }
}

/// What to do with the Lease as seen.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Write this spec as the new holder (create the Lease if it was absent).
    Acquire(LeaseSpec),
    /// Still ours: write this spec (a fresh `renewTime`).
    Renew(LeaseSpec),
    /// Another replica holds the Lease until `until` unless it renews first.
    Wait { holder: String, until: Instant },
    /// This replica was leading and no longer is: stop at once.
    Lost { holder: Option<String> },
}

/// The election's one decision. `seen` is `None` when the Lease does not exist; `leading`
/// says whether this replica believes it holds the Lease; `now` is the monotonic clock that
/// terms are measured with and `wall` the time written into the Lease.
pub fn decide(
    seen: Option<&Seen>,
    me: &str,
    leading: bool,
    now: Instant,
    wall: Timestamp,
    timing: &Timing,
) -> Step {
    let Some(seen) = seen else {
        // A leader whose Lease vanished cannot tell who else is creating it now.
        return if leading {
            Step::Lost { holder: None }
        } else {
            Step::Acquire(acquired(&LeaseSpec::default(), me, wall, timing))
        };
    };
    let holder = seen
        .spec
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty());
    match (holder, leading) {
        (Some(h), true) if h == me => Step::Renew(renewed(&seen.spec, wall)),
        (other, true) => Step::Lost {
            holder: other.map(str::to_owned),
        },
        // Our own identity from an earlier life of this replica: that process is gone.
        (None, false) => Step::Acquire(acquired(&seen.spec, me, wall, timing)),
        (Some(h), false) if h == me => Step::Acquire(acquired(&seen.spec, me, wall, timing)),
        (Some(h), false) => {
            // The holder's own promise where it made one (a released Lease says 1 s).
            let term = seen
                .spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(timing.lease_duration, Duration::from_secs);
            let until = seen.at + term;
            if now >= until {
                Step::Acquire(acquired(&seen.spec, me, wall, timing))
            } else {
                Step::Wait {
                    holder: h.to_owned(),
                    until,
                }
            }
        }
    }
}

/// `prev` taken over by `me`: a new term, one more transition when the holder changes.
fn acquired(prev: &LeaseSpec, me: &str, wall: Timestamp, timing: &Timing) -> LeaseSpec {
    let transitions = prev.lease_transitions.unwrap_or(0);
    let same = prev.holder_identity.as_deref() == Some(me);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(
            i32::try_from(timing.lease_duration.as_secs()).unwrap_or(i32::MAX),
        ),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(if same { transitions } else { transitions + 1 }),
        ..prev.clone()
    }
}

/// `spec` renewed at `wall`.
pub fn renewed(spec: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        renew_time: Some(MicroTime(wall)),
        ..spec.clone()
    }
}

/// `spec` given up: no holder and a 1 s term, so a standby takes it at its next read
/// (client-go's release).
pub fn released(spec: &LeaseSpec, wall: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(wall)),
        renew_time: Some(MicroTime(wall)),
        ..spec.clone()
    }
}

// === configuration ===

/// The Lease's namespace: the flag, else the pod's own namespace (the downward API's
/// `POD_NAMESPACE`, else the service account's mounted file), else the cluster's.
pub fn lease_namespace(
    flag: Option<&str>,
    pod_namespace: Option<&str>,
    namespace_file: Option<&str>,
    cluster_namespace: &str,
) -> String {
    [flag, pod_namespace, namespace_file.map(str::trim)]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or(cluster_namespace)
        .to_owned()
}

/// This replica's identity: the flag as given, else the pod's name (or the host's) with a
/// random suffix, so a restarted container never mistakes its predecessor's term for its
/// own (client-go's `id + "_" + uuid`).
pub fn identity(
    flag: Option<&str>,
    pod_name: Option<&str>,
    hostname: Option<&str>,
    suffix: &str,
) -> String {
    if let Some(f) = flag.filter(|f| !f.is_empty()) {
        return f.to_owned();
    }
    let base = [pod_name, hostname.map(str::trim)]
        .into_iter()
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or("tandem-bridge");
    format!("{base}_{suffix}")
}

/// Eight random hex digits. `RandomState` is seeded from the OS's random source per
/// process, which is all an identity suffix needs (no extra dependency).
pub fn random_suffix() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() & 0xffff_ffff)
}

/// Which Lease and who this replica is.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub timing: Timing,
}

// === the I/O ===

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The Lease as last read or written, and when this replica first saw that spec.
    seen: Option<Seen>,
    /// While leading: the Lease as last written (its resourceVersion guards the next renew).
    held: Option<Lease>,
    /// While leading: when the last successful write was *sent*. The server wrote it later,
    /// so the renew deadline counted from here ends before any standby's term does.
    renewed_at: Option<Instant>,
    /// The holder last logged, so a standby logs each change of leader once.
    told: Option<String>,
}

enum Attempt {
    Won,
    Wait(Instant),
    /// Someone else wrote between our read and our write: read again now.
    Raced,
}

impl Elector {
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            seen: None,
            held: None,
            renewed_at: None,
            told: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    fn lost(&self, why: String) -> Error {
        Error::Lost {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            why,
        }
    }

    /// Waits until this replica holds the Lease. API errors are logged and retried: a
    /// standby that cannot reach the API server simply stays a standby.
    pub async fn acquire(&mut self) {
        let retry = self.cfg.timing.retry_period;
        loop {
            let now = Instant::now();
            let wake = match self.try_acquire(now).await {
                Ok(Attempt::Won) => {
                    info!(lease = %self.cfg.name, namespace = %self.cfg.namespace, identity = %self.cfg.identity, "leading: this replica now schedules");
                    return;
                }
                Ok(Attempt::Wait(until)) => until.min(now + retry),
                Ok(Attempt::Raced) => {
                    debug!(lease = %self.cfg.name, "another candidate wrote the Lease first");
                    continue;
                }
                Err(e) => {
                    warn!(lease = %self.cfg.name, namespace = %self.cfg.namespace, error = %e, "reading or writing the Lease; standing by");
                    now + retry
                }
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }

    async fn try_acquire(&mut self, now: Instant) -> Result<Attempt, kube::Error> {
        let read = self.api.get_opt(&self.cfg.name).await?;
        let wall = Timestamp::now();
        self.seen = read
            .as_ref()
            .map(|l| observe(self.seen.take(), &l.spec.clone().unwrap_or_default(), now));
        let me = self.cfg.identity.clone();
        match decide(self.seen.as_ref(), &me, false, now, wall, &self.cfg.timing) {
            Step::Acquire(spec) => {
                let result = match read {
                    None => {
                        let lease = Lease {
                            metadata: ObjectMeta {
                                name: Some(self.cfg.name.clone()),
                                namespace: Some(self.cfg.namespace.clone()),
                                ..ObjectMeta::default()
                            },
                            spec: Some(spec),
                        };
                        self.api.create(&PostParams::default(), &lease).await
                    }
                    Some(l) => {
                        let lease = Lease {
                            metadata: l.metadata,
                            spec: Some(spec),
                        };
                        self.api
                            .replace(&self.cfg.name, &PostParams::default(), &lease)
                            .await
                    }
                };
                match result {
                    Ok(written) => {
                        self.wrote(written, now);
                        Ok(Attempt::Won)
                    }
                    // 409: a concurrent create (AlreadyExists) or a stale resourceVersion.
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Raced),
                    Err(e) => Err(e),
                }
            }
            Step::Wait { holder, until } => {
                if self.told.as_deref() != Some(holder.as_str()) {
                    info!(lease = %self.cfg.name, leader = %holder, "standing by: another replica leads");
                    self.told = Some(holder);
                }
                Ok(Attempt::Wait(until))
            }
            // Not leading, so neither renews nor loses; read again a retry period later.
            Step::Renew(_) | Step::Lost { .. } => {
                Ok(Attempt::Wait(now + self.cfg.timing.retry_period))
            }
        }
    }

    fn wrote(&mut self, lease: Lease, sent: Instant) {
        self.seen = Some(Seen {
            spec: lease.spec.clone().unwrap_or_default(),
            at: sent,
        });
        self.held = Some(lease);
        self.renewed_at = Some(sent);
    }

    /// While leading: renews every retry period and returns only when leadership is lost
    /// (another holder seen, the Lease gone, or no renewal within the renew deadline).
    pub async fn hold(&mut self) -> Error {
        let timing = self.cfg.timing;
        let Some(mut last) = self.renewed_at else {
            return self.lost("not leading".into());
        };
        let mut next = last + timing.retry_period;
        loop {
            tokio::time::sleep_until(next.into()).await;
            let start = Instant::now();
            let deadline = last + timing.renew_deadline;
            let Some(left) = deadline
                .checked_duration_since(start)
                .filter(|d| !d.is_zero())
            else {
                return self.lost(format!("not renewed within {:?}", timing.renew_deadline));
            };
            // A hanging request must not carry the leader past its deadline.
            match tokio::time::timeout(left, self.renew(start)).await {
                Err(_) => {
                    return self.lost(format!("not renewed within {:?}", timing.renew_deadline));
                }
                Ok(Ok(())) => {
                    last = start;
                    next = start + timing.retry_period;
                }
                Ok(Err(Renewal::Lost(holder))) => {
                    let who = holder.unwrap_or_else(|| "nobody (the Lease is gone)".into());
                    return self.lost(format!("the Lease is now held by {who}"));
                }
                Ok(Err(Renewal::Api(e))) => {
                    warn!(lease = %self.cfg.name, error = %e, "renewing the Lease; retrying");
                    next = (Instant::now() + timing.retry_period / 4).min(deadline);
                }
            }
        }
    }

    async fn renew(&mut self, start: Instant) -> Result<(), Renewal> {
        let Some(held) = self.held.clone() else {
            return Err(Renewal::Lost(None));
        };
        // The fast path: one replace guarded by the resourceVersion we wrote last.
        let spec = renewed(&held.spec.clone().unwrap_or_default(), Timestamp::now());
        let lease = Lease {
            metadata: held.metadata,
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.wrote(written, start);
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(Renewal::Lost(None)),
            Err(e) => return Err(Renewal::Api(e)),
        }
        // Someone else wrote the Lease: read it and see whether it is still ours.
        let read = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(Renewal::Api)?;
        self.seen = read
            .as_ref()
            .map(|l| observe(self.seen.take(), &l.spec.clone().unwrap_or_default(), start));
        let me = self.cfg.identity.clone();
        match decide(
            self.seen.as_ref(),
            &me,
            true,
            start,
            Timestamp::now(),
            &self.cfg.timing,
        ) {
            Step::Renew(spec) => {
                let Some(l) = read else {
                    return Err(Renewal::Lost(None));
                };
                let lease = Lease {
                    metadata: l.metadata,
                    spec: Some(spec),
                };
                let written = self
                    .api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
                    .map_err(Renewal::Api)?;
                self.wrote(written, start);
                Ok(())
            }
            Step::Lost { holder } => Err(Renewal::Lost(holder)),
            Step::Acquire(_) | Step::Wait { .. } => Err(Renewal::Lost(None)),
        }
    }

    /// Gives the Lease up (no holder, a 1 s term) so a standby takes over at its next read
    /// rather than after a full term. Best effort, bounded by [`RELEASE_TIMEOUT`].
    pub async fn release(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        self.renewed_at = None;
        let spec = released(&held.spec.clone().unwrap_or_default(), Timestamp::now());
        let lease = Lease {
            metadata: held.metadata,
            spec: Some(spec),
        };
        let pp = PostParams::default();
        let write = self.api.replace(&self.cfg.name, &pp, &lease);
        match tokio::time::timeout(RELEASE_TIMEOUT, write).await {
            Ok(Ok(_)) => {
                info!(lease = %self.cfg.name, identity = %self.cfg.identity, "released the Lease")
            }
            Ok(Err(e)) => {
                warn!(lease = %self.cfg.name, error = %e, "releasing the Lease; the standby waits out the term")
            }
            Err(_) => {
                warn!(lease = %self.cfg.name, "releasing the Lease timed out; the standby waits out the term")
            }
        }
    }
}

enum Renewal {
    Lost(Option<String>),
    Api(kube::Error),
}

/// How [`run_elected`] ended without losing the Lease.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// `shutdown` resolved (the Lease was released if held).
    Shutdown,
    /// The work ended by itself with this (the Lease was released).
    Finished(T),
}

/// Runs `work` only while this replica holds the Lease: waits to acquire it, then runs
/// `work` while renewing. Loss of the Lease drops `work` at once (never two schedulers) and
/// returns [`Error::Lost`]; shutdown or the end of `work` releases the Lease.
///
/// `work` is not polled before the Lease is held, so it may be built beforehand.
pub async fn run_elected<T>(
    mut elector: Elector,
    shutdown: impl Future<Output = ()>,
    work: impl Future<Output = T>,
) -> Result<Outcome<T>, Error> {
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => {
            info!(identity = %elector.identity(), "shutting down as a standby");
            return Ok(Outcome::Shutdown);
        }
        () = elector.acquire() => {}
    }
    let outcome = tokio::select! {
        // The renewal first: a leader resumed after a stall (SIGSTOP, a paused VM) finds its
        // deadline passed before the work may act on what queued up meanwhile.
        biased;
        lost = elector.hold() => {
            warn!(error = %lost, "leadership lost; stopping the scheduler");
            return Err(lost);
        }
        () = &mut shutdown => Outcome::Shutdown,
        out = work => Outcome::Finished(out),
    };
    elector.release().await;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "bridge-a";
    const OTHER: &str = "bridge-b";

    fn wall(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn held_by(holder: &str, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(10),
            acquire_time: Some(MicroTime(wall(0))),
            renew_time: Some(MicroTime(wall(0))),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn seen(spec: LeaseSpec, at: Instant) -> Seen {
        Seen { spec, at }
    }

    /// What a standby `ME` does at `now` (wall clock `wall(w)`), with the default timing.
    fn standby(seen: Option<&Seen>, now: Instant, w: i64) -> Step {
        decide(seen, ME, false, now, wall(w), &Timing::default())
    }

    /// What `ME` does at `now` while it leads, with the default timing.
    fn leading(seen: Option<&Seen>, now: Instant, w: i64) -> Step {
        decide(seen, ME, true, now, wall(w), &Timing::default())
    }

    #[test]
    fn an_absent_lease_is_created_with_a_first_transition() {
        let now = Instant::now();
        let Step::Acquire(spec) = standby(None, now, 5) else {
            panic!("acquire expected");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(10));
        assert_eq!(spec.renew_time, Some(MicroTime(wall(5))));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(5))));
        assert_eq!(spec.lease_transitions, Some(1));
    }

    #[test]
    fn a_live_holder_is_waited_for_until_its_observed_term_ends() {
        let t0 = Instant::now();
        let s = seen(held_by(OTHER, 3), t0);
        let step = standby(Some(&s), t0 + Duration::from_secs(9), 100);
        assert_eq!(
            step,
            Step::Wait {
                holder: OTHER.into(),
                until: t0 + Duration::from_secs(10)
            }
        );
    }

    #[test]
    fn a_silent_holder_is_taken_over_once_its_term_ran_out() {
        let t0 = Instant::now();
        let s = seen(held_by(OTHER, 3), t0);
        let Step::Acquire(spec) = standby(Some(&s), t0 + Duration::from_secs(10), 10) else {
            panic!("takeover expected");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(10))));
    }

    #[test]
    fn terms_run_on_the_candidates_clock_not_the_holders_renew_time() {
        // The holder's wall clock is an hour behind: its renewTime looks ancient, yet the
        // term counts from when this replica saw the renewal.
        let t0 = Instant::now();
        let mut spec = held_by(OTHER, 1);
        spec.renew_time = Some(MicroTime(wall(-3600)));
        let s = seen(spec, t0);
        assert!(matches!(
            standby(Some(&s), t0 + Duration::from_secs(1), 0),
            Step::Wait { .. }
        ));
    }

    #[test]
    fn a_renewal_seen_restarts_the_term_and_the_same_spec_does_not() {
        let t0 = Instant::now();
        let first = observe(None, &held_by(OTHER, 1), t0);
        let later = t0 + Duration::from_secs(4);
        let same = observe(Some(first.clone()), &held_by(OTHER, 1), later);
        assert_eq!(same.at, t0, "an unchanged record keeps its first sighting");
        let renewed_spec = renewed(&held_by(OTHER, 1), wall(4));
        let changed = observe(Some(first), &renewed_spec, later);
        assert_eq!(changed.at, later);
        assert_eq!(changed.spec, renewed_spec);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        let s = seen(released(&held_by(OTHER, 2), wall(1)), t0);
        assert_eq!(s.spec.holder_identity, None);
        let Step::Acquire(spec) = standby(Some(&s), t0, 1) else {
            panic!("a free Lease is taken without waiting");
        };
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(
            spec.lease_duration_seconds,
            Some(10),
            "our own term, not the 1 s release"
        );
    }

    #[test]
    fn an_empty_holder_string_counts_as_free() {
        let t0 = Instant::now();
        let mut spec = held_by("", 0);
        spec.lease_duration_seconds = Some(10);
        assert!(matches!(
            standby(Some(&seen(spec, t0)), t0, 0),
            Step::Acquire(_)
        ));
    }

    #[test]
    fn the_holders_promised_term_is_honoured() {
        let t0 = Instant::now();
        let mut spec = held_by(OTHER, 1);
        spec.lease_duration_seconds = Some(3);
        let s = seen(spec, t0);
        assert!(matches!(
            standby(Some(&s), t0 + Duration::from_secs(2), 0),
            Step::Wait { .. }
        ));
        assert!(matches!(
            standby(Some(&s), t0 + Duration::from_secs(3), 0),
            Step::Acquire(_)
        ));
    }

    #[test]
    fn the_leader_renews_keeping_its_acquire_time_and_transitions() {
        let t0 = Instant::now();
        let s = seen(held_by(ME, 5), t0);
        let Step::Renew(spec) = leading(Some(&s), t0, 6) else {
            panic!("renew expected");
        };
        assert_eq!(spec.renew_time, Some(MicroTime(wall(6))));
        assert_eq!(spec.acquire_time, Some(MicroTime(wall(0))));
        assert_eq!(spec.lease_transitions, Some(5));
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
    }

    #[test]
    fn a_leader_that_finds_another_holder_has_lost_whatever_the_times() {
        let t0 = Instant::now();
        let s = seen(held_by(OTHER, 6), t0);
        assert_eq!(
            leading(Some(&s), t0, 0),
            Step::Lost {
                holder: Some(OTHER.into())
            }
        );
        let free = seen(released(&held_by(OTHER, 6), wall(0)), t0);
        assert_eq!(leading(Some(&free), t0, 0), Step::Lost { holder: None });
        assert_eq!(
            leading(None, t0, 0),
            Step::Lost { holder: None },
            "a vanished Lease may be being created by a standby"
        );
    }

    #[test]
    fn our_own_identity_left_from_an_earlier_life_is_taken_without_waiting() {
        let t0 = Instant::now();
        let s = seen(held_by(ME, 2), t0);
        let Step::Acquire(spec) = standby(Some(&s), t0, 1) else {
            panic!("acquire expected");
        };
        assert_eq!(spec.lease_transitions, Some(2), "no change of holder");
    }

    #[test]
    fn the_leader_stops_before_any_standby_may_take_over() {
        // The standby saw the last renewal no earlier than the leader sent it; the leader's
        // deadline counts from sending, so it ends first, for every lease length.
        for s in [2, 3, 5, 10, 15, 60] {
            let t = Timing::for_lease_seconds(s).unwrap();
            assert!(t.renew_deadline < t.lease_duration, "{s}: {t:?}");
            assert!(
                t.retry_period < t.renew_deadline,
                "{s}: renews before its deadline"
            );
            assert!(!t.retry_period.is_zero());
        }
        assert_eq!(Timing::for_lease_seconds(10).unwrap(), Timing::default());
        assert!(Timing::for_lease_seconds(1).is_err());
    }

    #[test]
    fn the_default_timing_takes_over_well_within_15_seconds() {
        // Worst case: the standby sees the last renewal one retry period late, then wakes
        // exactly when the term ends (plus one read).
        let t = Timing::default();
        let worst = t.retry_period + t.lease_duration + t.retry_period;
        assert!(worst < Duration::from_secs(15), "{worst:?}");
    }

    #[test]
    fn the_lease_namespace_prefers_flag_then_pod_then_file_then_cluster() {
        assert_eq!(lease_namespace(Some("a"), Some("b"), Some("c\n"), "d"), "a");
        assert_eq!(lease_namespace(None, Some("b"), Some("c\n"), "d"), "b");
        assert_eq!(lease_namespace(None, None, Some("c\n"), "d"), "c");
        assert_eq!(lease_namespace(None, Some(""), Some(" \n"), "d"), "d");
        assert_eq!(lease_namespace(None, None, None, "d"), "d");
    }

    #[test]
    fn identities_are_the_flag_or_the_pod_name_with_a_suffix() {
        assert_eq!(identity(Some("x"), Some("pod"), Some("host"), "ab"), "x");
        assert_eq!(identity(None, Some("pod"), Some("host"), "ab"), "pod_ab");
        assert_eq!(identity(Some(""), None, Some("host\n"), "ab"), "host_ab");
        assert_eq!(identity(None, None, None, "ab"), "tandem-bridge_ab");
        let (a, b) = (random_suffix(), random_suffix());
        assert_eq!(a.len(), 8);
        assert_ne!(a, b, "two suffixes in one process differ");
    }
}
