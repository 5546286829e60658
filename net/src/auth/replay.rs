//! The replay cache: a credential's nonce is accepted on one connection only, until it
//! expires.
//!
//! A client process gets one credential and uses it for every request on its connection
//! (one agent round trip per process), so "seen twice" means seen on two connections: a
//! credential copied off the wire or out of a process and replayed from elsewhere is refused.
//! Entries leave when their credential expires, so memory is bounded by the credentials
//! alive at once; past [`DEFAULT_CAPACITY`] of those, new credentials are refused
//! (`RESOURCE_EXHAUSTED`) rather than forgetting live nonces.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::TokenError;

/// Live credentials remembered at most (~64 bytes each: about 64 MiB at the limit).
pub const DEFAULT_CAPACITY: usize = 1 << 20;

/// Nonces seen, with the connection that first showed each and its expiry.
#[derive(Debug)]
pub struct ReplayCache {
    seen: HashMap<u128, (i64, u64)>,
    /// Expiry order, for pruning.
    order: BinaryHeap<Reverse<(i64, u128)>>,
    capacity: usize,
}

impl Default for ReplayCache {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl ReplayCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            seen: HashMap::new(),
            order: BinaryHeap::new(),
            capacity: capacity.max(1),
        }
    }

    /// Accepts `nonce` on connection `conn` if it is new, or was first seen on `conn`.
    pub fn check(&mut self, nonce: u128, conn: u64, exp: i64, now: i64) -> Result<(), TokenError> {
        self.prune(now);
        match self.seen.get(&nonce) {
            Some(&(_, first)) if first == conn => Ok(()),
            Some(_) => Err(TokenError::Replayed),
            None => {
                if self.seen.len() >= self.capacity {
                    return Err(TokenError::CacheFull);
                }
                self.seen.insert(nonce, (exp, conn));
                self.order.push(Reverse((exp, nonce)));
                Ok(())
            }
        }
    }

    /// Forgets credentials expired at `now` (they are refused by their expiry anyway).
    fn prune(&mut self, now: i64) {
        while let Some(Reverse((exp, nonce))) = self.order.peek().copied() {
            if exp > now {
                break;
            }
            self.order.pop();
            self.seen.remove(&nonce);
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_connection_may_reuse_other_connection_may_not() {
        let mut c = ReplayCache::new(10);
        assert_eq!(c.check(1, 7, 100, 0), Ok(()));
        assert_eq!(c.check(1, 7, 100, 50), Ok(()));
        assert_eq!(c.check(1, 8, 100, 50), Err(TokenError::Replayed));
        assert_eq!(c.check(2, 8, 100, 50), Ok(()));
    }

    #[test]
    fn expired_entries_leave_and_capacity_is_enforced() {
        let mut c = ReplayCache::new(2);
        c.check(1, 1, 10, 0).unwrap();
        c.check(2, 1, 20, 0).unwrap();
        assert_eq!(c.check(3, 1, 30, 5), Err(TokenError::CacheFull));
        // At t=10 the first expired: room again, and nonce 1 is forgotten.
        assert_eq!(c.check(3, 1, 30, 10), Ok(()));
        assert_eq!(c.len(), 2);
        c.check(4, 1, 40, 25).unwrap();
        assert_eq!(c.len(), 2);
    }
}
