//! Trackable resources (Slurm's TRES): CPUs, memory and GPUs. Billing weights live with fair
//! share (`fairshare::BillingWeights`).
//!
//! GPU *types* are not part of [`Tres`]: a node has at most one GPU type (`Node::gpu_type`)
//! and a job may require one (`JobSpec::gpu_type`). Keeping the type out of the arithmetic
//! keeps `Tres` `Copy` and the timeline math allocation-free.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An amount of CPUs, memory (MiB) and GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tres {
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: u32,
}

impl Tres {
    pub const ZERO: Tres = Tres {
        cpus: 0,
        mem_mb: 0,
        gpus: 0,
    };

    pub const fn new(cpus: u32, mem_mb: u64, gpus: u32) -> Self {
        Tres { cpus, mem_mb, gpus }
    }

    /// Whether `self` fits inside `avail` in every dimension.
    pub fn fits_in(&self, avail: &Tres) -> bool {
        self.cpus <= avail.cpus && self.mem_mb <= avail.mem_mb && self.gpus <= avail.gpus
    }

    pub fn checked_add(&self, o: &Tres) -> Option<Tres> {
        Some(Tres {
            cpus: self.cpus.checked_add(o.cpus)?,
            mem_mb: self.mem_mb.checked_add(o.mem_mb)?,
            gpus: self.gpus.checked_add(o.gpus)?,
        })
    }

    pub fn checked_sub(&self, o: &Tres) -> Option<Tres> {
        Some(Tres {
            cpus: self.cpus.checked_sub(o.cpus)?,
            mem_mb: self.mem_mb.checked_sub(o.mem_mb)?,
            gpus: self.gpus.checked_sub(o.gpus)?,
        })
    }

    pub fn saturating_add(&self, o: &Tres) -> Tres {
        Tres {
            cpus: self.cpus.saturating_add(o.cpus),
            mem_mb: self.mem_mb.saturating_add(o.mem_mb),
            gpus: self.gpus.saturating_add(o.gpus),
        }
    }

    pub fn saturating_sub(&self, o: &Tres) -> Tres {
        Tres {
            cpus: self.cpus.saturating_sub(o.cpus),
            mem_mb: self.mem_mb.saturating_sub(o.mem_mb),
            gpus: self.gpus.saturating_sub(o.gpus),
        }
    }

    /// `self` times `n`, saturating.
    pub fn saturating_mul(&self, n: u32) -> Tres {
        Tres {
            cpus: self.cpus.saturating_mul(n),
            mem_mb: self.mem_mb.saturating_mul(u64::from(n)),
            gpus: self.gpus.saturating_mul(n),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Tres::ZERO
    }
}

/// Slurm's AllocTRES form: `cpu=4,mem=16G,node=1,gres/gpu=2` without the node count.
impl fmt::Display for Tres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu={},mem={}", self.cpus, format_mem_mb(self.mem_mb))?;
        if self.gpus > 0 {
            write!(f, ",gres/gpu={}", self.gpus)?;
        }
        Ok(())
    }
}

/// Memory as Slurm prints it in TRES strings: `512M`, `16G`, `1.50T`.
pub fn format_mem_mb(mb: u64) -> String {
    if mb >= 1024 * 1024 && mb.is_multiple_of(1024 * 1024) {
        format!("{}T", mb / (1024 * 1024))
    } else if mb >= 1024 && mb.is_multiple_of(1024) {
        format!("{}G", mb / 1024)
    } else if mb >= 1024 * 1024 {
        format!("{:.2}T", mb as f64 / (1024.0 * 1024.0))
    } else if mb >= 1024 {
        format!("{:.2}G", mb as f64 / 1024.0)
    } else {
        format!("{mb}M")
    }
}

/// Error of [`parse_mem_mb`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid memory size {input:?}: {problem}")]
pub struct MemError {
    pub input: String,
    pub problem: String,
}

/// Parses a memory size in Slurm's units, as `--mem`, `--mem-per-cpu` and a node's memory
/// (`tandem worker --mem`, `RealMemory`) take it: a whole number with an optional unit `K`,
/// `M` (the default), `G` or `T`, binary multiples, case-insensitive, with an optional
/// trailing `B` (`16GB`). Returns MiB, rounding kibibytes *up* to whole MiB as Slurm does
/// (`str_to_mbytes`: `4K` is 1 MiB, `1025K` 2 MiB).
///
/// `0` is a size (Slurm's `--mem=0` asks for all of a node's memory); callers for which it
/// is meaningless refuse it themselves. Refused: no number, a sign, a fraction (`1.5G`), an
/// unknown unit (`4X`, `4 G`), and anything past `u64::MAX` MiB.
pub fn parse_mem_mb(s: &str) -> Result<u64, MemError> {
    let err = |problem: String| MemError {
        input: s.to_string(),
        problem,
    };
    let t = s.trim();
    let t = t.strip_suffix(['b', 'B']).unwrap_or(t);
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    if digits.is_empty() {
        return Err(err(if t.starts_with('-') {
            "must not be negative".into()
        } else {
            "expected a whole number, optionally followed by K, M, G or T (examples: 4096, 64G)"
                .into()
        }));
    }
    let too_large = || err("too large".into());
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    match unit.to_ascii_uppercase().as_str() {
        "K" => Ok(n.div_ceil(1024)),
        "" | "M" => Ok(n),
        "G" => n.checked_mul(1024).ok_or_else(too_large),
        "T" => n.checked_mul(1024 * 1024).ok_or_else(too_large),
        _ => Err(err(format!("unknown unit {unit:?} (use K, M, G or T)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_is_checked() {
        let a = Tres::new(4, 1024, 2);
        let b = Tres::new(8, 2048, 2);
        assert!(a.fits_in(&b));
        assert!(!b.fits_in(&a));
        assert_eq!(b.checked_sub(&a), Some(Tres::new(4, 1024, 0)));
        assert_eq!(a.checked_sub(&b), None);
        assert_eq!(a.checked_add(&b), Some(Tres::new(12, 3072, 4)));
        assert_eq!(
            Tres::new(u32::MAX, 0, 0).checked_add(&Tres::new(1, 0, 0)),
            None
        );
    }

    #[test]
    fn memory_sizes_parse_like_slurm() {
        let cases = [
            ("100", 100),
            ("4G", 4096),
            ("4g", 4096),
            ("64GB", 65_536),
            ("64gb", 65_536),
            ("2048M", 2048),
            ("512m", 512),
            ("512MB", 512),
            ("1T", 1 << 20),
            ("1t", 1 << 20),
            (" 8G ", 8192),
            // Kibibytes round up to whole MiB, as Slurm's str_to_mbytes does.
            ("4K", 1),
            ("4k", 1),
            ("1K", 1),
            ("1024K", 1),
            ("1025K", 2),
            ("1500K", 2),
            ("2048KB", 2),
            // 0 is a size (--mem=0: all of the node's memory), in any unit.
            ("0", 0),
            ("0K", 0),
            ("0G", 0),
            // The edges of u64.
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615K", u64::MAX.div_ceil(1024)),
            ("18014398509481983G", (u64::MAX >> 10) << 10),
            ("17592186044415T", (u64::MAX >> 20) << 20),
        ];
        for (input, want) in cases {
            assert_eq!(parse_mem_mb(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn bad_memory_sizes_say_what_is_wrong() {
        let cases = [
            ("", "expected a whole number"),
            ("  ", "expected a whole number"),
            ("G", "expected a whole number"),
            ("B", "expected a whole number"),
            ("+4G", "expected a whole number"),
            ("-5", "must not be negative"),
            ("-1G", "must not be negative"),
            ("4X", "unknown unit \"X\" (use K, M, G or T)"),
            ("4P", "unknown unit \"P\""),
            ("4KiB", "unknown unit \"Ki\""),
            ("4.5G", "unknown unit \".5G\""),
            ("4 G", "unknown unit \" G\""),
            ("4GG", "unknown unit \"GG\""),
            ("18446744073709551616", "too large"),
            ("99999999999999999999K", "too large"),
            ("18014398509481984G", "too large"),
            ("17592186044416T", "too large"),
        ];
        for (input, want) in cases {
            let e = parse_mem_mb(input).expect_err(input);
            assert_eq!(e.input, input);
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("invalid memory size {input:?}: "))
                    && text.contains(want),
                "{input:?}: {text}"
            );
        }
    }

    #[test]
    fn display_is_alloc_tres_form() {
        assert_eq!(
            Tres::new(4, 16384, 2).to_string(),
            "cpu=4,mem=16G,gres/gpu=2"
        );
        assert_eq!(Tres::new(1, 500, 0).to_string(), "cpu=1,mem=500M");
    }
}
