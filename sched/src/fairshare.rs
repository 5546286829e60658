//! Fair share by Slurm's **Fair Tree** algorithm.
//!
//! The account tree holds accounts, sub-accounts and users (a user under an
//! account is an *association*, as in Slurm). Each association has raw shares
//! and accumulates usage in billing-weighted TRES-seconds, decayed with a
//! half-life. [`AssocTree::compute`] turns shares and usage into the numbers
//! `sshare` prints and into a fair-share factor per user association.
//!
//! # Algorithm (Slurm `fair_tree.html`)
//!
//! ```text
//!   root ─┬─ A (LF 2.0) ─┬─ alice (LF 3.0)   rank 4 -> 4/4
//!         │              └─ bob   (LF 0.5)   rank 3 -> 3/4
//!         └─ B (LF 0.7) ─┬─ carol (LF inf)   rank 2 -> 2/4
//!                        └─ dave  (LF 1.0)   rank 1 -> 1/4
//! ```
//!
//! 1. At every level, each child's *level fair share* is `LF = S / U`, with
//!    `S` its shares over the sum of its siblings' shares (itself included)
//!    and `U` its usage over the sum of its siblings' usage. No usage means
//!    `LF = inf`; zero shares means `LF = 0`.
//! 2. Children are sorted by `LF`, highest first, and visited depth-first:
//!    a user gets the next rank, an account is descended into. So if account A
//!    outranks its sibling B, every user under A outranks every user under B.
//! 3. Ranks count down from the number of users `n`; the factor is
//!    `rank / n` (the first user visited gets 1.0, the last `1/n`).
//!
//! Ties, as the documentation states them: sibling users with equal `LF` get
//! the same rank; a user tied with a sibling account gets the same rank as that
//! account's highest ranked user; sibling accounts with equal `LF` have their
//! children merged into one list before sorting. A tie consumes ranks as if it
//! were not one (competition ranking: 4, 4, 2, ...), as Slurm's implementation
//! does with its "rank not tied" counter.
//!
//! # Invariants
//!
//! - A parent is always created before its children, so its index is smaller;
//!   subtree sums are one reverse sweep over the arena.
//! - Indices ([`AssocIdx`]) are stable: removing an association tombstones it.
//! - Usage is never negative; decay multiplies, charging adds.
//!
//! # Layout
//!
//! - `tree`: the association arena and its edits ([`AssocTree`]), the name rule.
//! - `usage`: billing weights, charging, refunds, decay, carrying usage over a rebuild.
//! - `rank`: Fair Tree ranking into a [`FairShareTable`].
//! - `sshare`: the rows `sshare` prints.

mod rank;
mod sshare;
#[cfg(test)]
mod tests;
mod tree;
mod usage;

pub use rank::{AssocShare, FairShareTable};
pub use sshare::{SshareRow, sshare_rows};
pub use tree::{AssocIdx, AssocKind, AssocTree, FairShareError, MAX_NAME_LEN, check_name};
pub use usage::{BillingWeights, decay};

/// Slurm's default `PriorityDecayHalfLife` (7 days).
pub const DEFAULT_HALF_LIFE_S: u64 = 7 * 24 * 3600;
/// Shares an association gets when none are given (Slurm's `Fairshare=1`).
pub const DEFAULT_SHARES: u32 = 1;
/// Name of the root account that every tree starts with.
pub const ROOT_ACCOUNT: &str = "root";
