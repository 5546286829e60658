//! The harness's address plan: pod IPs and Service cluster IPs are loopback addresses, so a
//! pod's process can bind its own IP and the service proxy can bind a cluster IP without any
//! network configuration (Linux routes all of `127.0.0.0/8` to `lo`).
//!
//! | what | range | who assigns it |
//! |---|---|---|
//! | pod IPs | `127.64.0.0/10` (127.64.0.1 .. 127.127.255.254) | the process kubelet, per pod |
//! | Service cluster IPs | `127.128.0.0/10` (127.128.0.1 .. 127.191.255.254) | the API server, on create |
//! | node (host) IPs, `hostNetwork` pods | `127.0.0.1` | fixed |
//!
//! Addresses are drawn at random from each range (4 Mi addresses) rather than counted up
//! from the start, because tests run in parallel, in several processes, each with its own
//! API server and kubelet: two test clusters would otherwise hand out the same first pod IP
//! and their pods would collide on it. Within one process a pod IP is never handed out twice
//! while in use ([`PodIps`]).

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// A block of loopback addresses `base/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

/// Where pod IPs come from.
pub const POD_BLOCK: Block = Block {
    base: Ipv4Addr::new(127, 64, 0, 0),
    prefix: 10,
};

/// Where Service cluster IPs come from.
pub const SERVICE_BLOCK: Block = Block {
    base: Ipv4Addr::new(127, 128, 0, 0),
    prefix: 10,
};

/// The address of every node, and of `hostNetwork` pods.
pub const HOST_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;

impl Block {
    /// Whether `ip` lies in the block.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        u32::from(ip) & mask == u32::from(self.base) & mask
    }

    /// The address at `offset` within the block (wrapping), skipping host parts ending in
    /// `.0` or `.255` so no address looks like a network or broadcast address.
    pub fn at(&self, offset: u32) -> Ipv4Addr {
        let size = 1u32 << (32 - u32::from(self.prefix));
        let ip = u32::from(self.base) + offset % size;
        let ip = match ip & 0xff {
            0 => ip + 1,
            255 => ip - 1,
            _ => ip,
        };
        Ipv4Addr::from(ip)
    }

    /// A random address of the block.
    pub fn random(&self) -> Ipv4Addr {
        self.at(rand::random())
    }
}

/// Pod IPs in use in this process (every kubelet of the process shares it).
#[derive(Debug, Default)]
pub struct PodIps {
    used: Mutex<HashSet<Ipv4Addr>>,
}

static POD_IPS: std::sync::LazyLock<PodIps> = std::sync::LazyLock::new(PodIps::default);

impl PodIps {
    /// The pool shared by every kubelet in this process.
    pub fn global() -> &'static PodIps {
        &POD_IPS
    }

    /// A pod IP not in use by another pod of this process.
    pub fn allocate(&self) -> Ipv4Addr {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let ip = POD_BLOCK.random();
            if used.insert(ip) {
                return ip;
            }
        }
    }

    /// Gives a pod IP back once its pod is gone.
    pub fn release(&self, ip: Ipv4Addr) {
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_disjoint_loopback_ranges() {
        for offset in [0, 1, 255, 256, u32::MAX, 0x3f_ffff, 12345678] {
            let p = POD_BLOCK.at(offset);
            let s = SERVICE_BLOCK.at(offset);
            assert!(p.is_loopback() && s.is_loopback(), "{p} {s}");
            assert!(POD_BLOCK.contains(p) && !SERVICE_BLOCK.contains(p), "{p}");
            assert!(SERVICE_BLOCK.contains(s) && !POD_BLOCK.contains(s), "{s}");
            assert!(!matches!(p.octets()[3], 0 | 255), "{p}");
            assert_ne!(p, HOST_IP);
        }
        assert_eq!(POD_BLOCK.at(0), Ipv4Addr::new(127, 64, 0, 1));
        assert_eq!(
            SERVICE_BLOCK.at(u32::MAX),
            Ipv4Addr::new(127, 191, 255, 254)
        );
    }

    #[test]
    fn pod_ips_are_unique_while_in_use() {
        let pool = PodIps::default();
        let ips: HashSet<Ipv4Addr> = (0..2000).map(|_| pool.allocate()).collect();
        assert_eq!(ips.len(), 2000);
        let one = *ips.iter().next().unwrap();
        pool.release(one);
        assert!(!pool.used.lock().unwrap().contains(&one));
    }
}
