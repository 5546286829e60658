//! The `bpf(2)` calls behind the cgroup v2 device filter: load a
//! `BPF_PROG_TYPE_CGROUP_DEVICE` program ([`super::devfilter`] assembles it) and attach it
//! to a cgroup directory with `BPF_F_ALLOW_MULTI`, so the programs of the cgroups above (a
//! container runtime's, systemd's) still apply too. The attachment holds the program: its
//! file descriptor is closed at once, and it goes away with the cgroup.
//!
//! The only `unsafe` of the crate: the raw system call (no wrapper in `nix` or `std`).

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::libc;

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;

/// What the program is listed as (`bpftool cgroup tree`); at most 15 bytes and a NUL.
const PROG_NAME: &[u8] = b"tandem_devices";
/// No GPL-only helper is called, so the license is only a label.
const LICENSE: &[u8] = b"Apache-2.0\0";
/// Room for the verifier's log when a load fails.
const LOG_SIZE: usize = 64 * 1024;

/// The leading fields of `union bpf_attr` that `BPF_PROG_LOAD` reads, up to `prog_name`:
/// every field is naturally aligned, so the layout has no padding (asserted below). The
/// kernel zero-fills the fields past `size_of::<ProgLoadAttr>()`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// The leading fields of `union bpf_attr` that `BPF_PROG_ATTACH` reads (no padding).
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

// The offsets of `linux/bpf.h`; a compile error if the layout ever differs.
const _: () = {
    assert!(std::mem::size_of::<ProgLoadAttr>() == 64);
    assert!(std::mem::offset_of!(ProgLoadAttr, insns) == 8);
    assert!(std::mem::offset_of!(ProgLoadAttr, license) == 16);
    assert!(std::mem::offset_of!(ProgLoadAttr, log_level) == 24);
    assert!(std::mem::offset_of!(ProgLoadAttr, log_buf) == 32);
    assert!(std::mem::offset_of!(ProgLoadAttr, kern_version) == 40);
    assert!(std::mem::offset_of!(ProgLoadAttr, prog_name) == 48);
    assert!(std::mem::size_of::<ProgAttachAttr>() == 16);
    assert!(std::mem::offset_of!(ProgAttachAttr, attach_flags) == 12);
};

/// Loads `insns` (encoded `struct bpf_insn`s) as a device program and attaches it to the
/// cgroup directory `dir`. Errors say which step failed, with the verifier's log when the
/// kernel refused the program.
pub fn attach_device_program(dir: &Path, insns: &[u8]) -> io::Result<()> {
    let prog = load_device_program(insns)?;
    let cgroup = File::open(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", dir.display())))?;
    attach(cgroup.as_fd(), prog.as_fd()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "BPF_PROG_ATTACH to {}: {e}{}",
                dir.display(),
                hint(&e, true)
            ),
        )
    })
    // `prog` and `cgroup` close here; the attachment keeps the program.
}

fn load_device_program(insns: &[u8]) -> io::Result<OwnedFd> {
    if insns.is_empty() || !insns.len().is_multiple_of(8) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} bytes are no BPF program", insns.len()),
        ));
    }
    match prog_load(insns, None) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            // Again with the verifier's log, to say why.
            let mut log = vec![0u8; LOG_SIZE];
            let again = prog_load(insns, Some(&mut log));
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let err = again.err().unwrap_or(first);
            let log = if text.is_empty() {
                match err.raw_os_error() {
                    Some(libc::EINVAL) => {
                        " (a kernel without CONFIG_CGROUP_BPF knows no device programs)".to_owned()
                    }
                    _ => String::new(),
                }
            } else {
                format!("; verifier log: {text}")
            };
            Err(io::Error::new(
                err.kind(),
                format!(
                    "BPF_PROG_LOAD (cgroup device program): {err}{}{log}",
                    hint(&err, false)
                ),
            ))
        }
    }
}

/// A likely cause of `e`, for the operator; `attaching`: from BPF_PROG_ATTACH.
fn hint(e: &io::Error, attaching: bool) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) if attaching => {
            " (a program attached to a cgroup above without BPF_F_ALLOW_MULTI forbids more)"
        }
        Some(libc::EPERM) => {
            " (needs CAP_SYS_ADMIN, or CAP_BPF with CAP_NET_ADMIN; before Linux 5.11 also \
             RLIMIT_MEMLOCK room)"
        }
        Some(libc::EINVAL) if attaching => {
            " (not a cgroup2 directory, or a kernel without CONFIG_CGROUP_BPF)"
        }
        Some(libc::ENOSYS) => " (kernel without the bpf system call)",
        _ => "",
    }
}

fn prog_load(insns: &[u8], log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    let mut prog_name = [0u8; 16];
    prog_name[..PROG_NAME.len()].copy_from_slice(PROG_NAME);
    let (log_level, log_size, log_buf) = match log {
        // The kernel writes at most `log_size` bytes, NUL-terminated.
        Some(buf) => (
            1,
            u32::try_from(buf.len()).unwrap_or(u32::MAX),
            buf.as_mut_ptr() as u64,
        ),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len() / 8)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
    };
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` value whose layout is the
    // leading 64 bytes of `union bpf_attr` for BPF_PROG_LOAD (checked at compile time above;
    // no padding, so every byte the kernel copies is initialized), and the size passed is
    // exactly its size. The pointers in it are valid for what the kernel reads or writes
    // during the call: `insns` for `insn_cnt * 8` bytes (`insns.len()` is a multiple of 8,
    // checked by the caller), `license` a NUL-terminated static, `log_buf` (when set) a
    // writable buffer of `log_size` bytes borrowed for the whole call. The kernel keeps none
    // of these pointers after it returns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &raw mut attr,
            std::mem::size_of::<ProgLoadAttr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("bpf(2) returned a bad fd"))?;
    // SAFETY: on success BPF_PROG_LOAD returns a new file descriptor (O_CLOEXEC) that nothing
    // else in this process owns; the `OwnedFd` becomes its only owner and closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn attach(cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let fd = |fd: BorrowedFd<'_>| {
        u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::other("negative fd"))
    };
    let mut attr = ProgAttachAttr {
        target_fd: fd(cgroup)?,
        attach_bpf_fd: fd(prog)?,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` value laid out as the
    // leading 16 bytes of `union bpf_attr` for BPF_PROG_ATTACH (checked at compile time; no
    // padding), and the size passed is exactly its size. It holds no pointers; the two fds
    // are open for the whole call (`BorrowedFd`s outlive it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_ATTACH,
            &raw mut attr,
            std::mem::size_of::<ProgAttachAttr>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::devfilter::{self, Insn, op};

    #[test]
    fn a_refused_program_brings_the_verifiers_words() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("SKIP a_refused_program_brings_the_verifiers_words: needs root to load BPF");
            return;
        }
        // Returns 2: a device program may only return 0 or 1.
        let bad = [
            Insn {
                code: op::MOV64_K,
                dst: 0,
                src: 0,
                off: 0,
                imm: 2,
            },
            Insn {
                code: op::EXIT,
                dst: 0,
                src: 0,
                off: 0,
                imm: 0,
            },
        ];
        let err = load_device_program(&devfilter::encode(&bad))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("BPF_PROG_LOAD"), "{err}");
        assert!(err.contains("verifier log:"), "{err}");
        // The real thing loads (where the kernel has cgroup BPF at all).
        let good = devfilter::program(&[]).unwrap();
        match load_device_program(&devfilter::encode(&good)) {
            Ok(_) => {}
            Err(e) => eprintln!("SKIP the valid program: the kernel refused it: {e}"),
        }
        assert!(load_device_program(&[0; 7]).is_err());
    }
}
