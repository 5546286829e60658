//! The cgroup v2 device filter, pure: a `BPF_PROG_TYPE_CGROUP_DEVICE` program assembled by
//! hand (as runc and crun do; no BPF toolchain, no ELF) from the same deny list the v1
//! `devices.deny` writer uses ([`JobLimits::deny`](super::plan::JobLimits)).
//!
//! The kernel runs the program on every device open and mknod in the cgroup with a
//! `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`, where
//! `access_type` is `(access << 16) | type` (type 1 block, 2 character; access bits mknod 1,
//! read 2, write 4); 1 allows, 0 refuses (`EPERM`). Like v1's `c MAJOR:MINOR rwm`, the
//! program refuses every access to the character devices of the list and allows everything
//! else: the allocated GPUs, `nvidiactl`, `nvidia-uvm`, and all other devices. The loader is
//! `cgroup::bpf`.

use super::plan::CharDevice;

/// `BPF_DEVCG_DEV_CHAR`: the device type of a character device in `access_type`.
pub const DEV_CHAR: u32 = 2;

/// One instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

/// The opcodes the program uses (`linux/bpf_common.h`, `linux/bpf.h`).
pub mod op {
    /// `BPF_LDX | BPF_MEM | BPF_W`: `dst = *(u32 *)(src + off)`.
    pub const LDX_MEM_W: u8 = 0x61;
    /// `BPF_ALU | BPF_AND | BPF_K`: `dst = (u32)dst & (u32)imm`.
    pub const AND32_K: u8 = 0x54;
    /// `BPF_JMP | BPF_JNE | BPF_K`: `if dst != (s64)imm goto pc + 1 + off`.
    pub const JNE_K: u8 = 0x55;
    /// `BPF_ALU64 | BPF_MOV | BPF_K`: `dst = (s64)imm`.
    pub const MOV64_K: u8 = 0xb7;
    /// `BPF_JMP | BPF_EXIT`: return `r0`.
    pub const EXIT: u8 = 0x95;
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Self {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    /// The kernel's 8 bytes: `code`, the register byte (`dst_reg:4, src_reg:4` bit-fields,
    /// so `dst` is the low nibble on little-endian machines and the high one on big-endian
    /// ones), then `off` and `imm` in native byte order.
    pub fn to_bytes(self) -> [u8; 8] {
        let regs = if cfg!(target_endian = "little") {
            (self.src << 4) | (self.dst & 0x0f)
        } else {
            (self.dst << 4) | (self.src & 0x0f)
        };
        let [o0, o1] = self.off.to_ne_bytes();
        let [i0, i1, i2, i3] = self.imm.to_ne_bytes();
        [self.code, regs, o0, o1, i0, i1, i2, i3]
    }
}

/// Whether a job whose deny list is `deny` may access device `major:minor` of type `kind`
/// (any access): the rule the program implements, and the same as v1's `devices.deny`.
pub fn allows(deny: &[CharDevice], kind: u32, major: u32, minor: u32) -> bool {
    !(kind == DEV_CHAR
        && deny
            .iter()
            .any(|d| d.major == u64::from(major) && d.minor == u64::from(minor)))
}

/// The program for `deny`:
///
/// ```text
///   r2 = *(u32 *)(r1 + 0); w2 &= 0xffff   // device type
///   r3 = *(u32 *)(r1 + 4)                 // major
///   r4 = *(u32 *)(r1 + 8)                 // minor
///   if r2 != 2 goto allow                 // not a character device
///   for each denied MAJOR:MINOR:
///     if r3 != MAJOR goto next; if r4 != MINOR goto next; r0 = 0; exit
///   allow: r0 = 1; exit
/// ```
///
/// An error when a number does not fit an immediate (a kernel device number always does).
pub fn program(deny: &[CharDevice]) -> Result<Vec<Insn>, String> {
    const CHECK_LEN: usize = 4;
    let skip_all = i16::try_from(deny.len() * CHECK_LEN)
        .map_err(|_| format!("{} denied devices: too many for one program", deny.len()))?;
    let imm = |what: &str, v: u64| {
        i32::try_from(v).map_err(|_| format!("device {what} number {v} out of range"))
    };
    let mut p = vec![
        Insn::new(op::LDX_MEM_W, 2, 1, 0, 0),
        Insn::new(op::AND32_K, 2, 0, 0, 0xffff),
        Insn::new(op::LDX_MEM_W, 3, 1, 4, 0),
        Insn::new(op::LDX_MEM_W, 4, 1, 8, 0),
        Insn::new(op::JNE_K, 2, 0, skip_all, DEV_CHAR as i32),
    ];
    for d in deny {
        p.extend([
            Insn::new(op::JNE_K, 3, 0, 3, imm("major", d.major)?),
            Insn::new(op::JNE_K, 4, 0, 2, imm("minor", d.minor)?),
            Insn::new(op::MOV64_K, 0, 0, 0, 0),
            Insn::new(op::EXIT, 0, 0, 0, 0),
        ]);
    }
    p.extend([
        Insn::new(op::MOV64_K, 0, 0, 0, 1),
        Insn::new(op::EXIT, 0, 0, 0, 0),
    ]);
    Ok(p)
}

/// The program as the bytes `BPF_PROG_LOAD` takes.
pub fn encode(prog: &[Insn]) -> Vec<u8> {
    prog.iter().flat_map(|i| i.to_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `prog` on the context `[access_type, major, minor]` the way the kernel would,
    /// for just the opcodes [`program`] emits; panics on anything the verifier would reject
    /// (an unknown opcode, a read of an unset register, a context access other than an
    /// aligned u32 field, a jump backwards or out of the program, a return other than 0/1).
    fn run(prog: &[Insn], ctx: [u32; 3]) -> u64 {
        const CTX: usize = 1;
        let mut regs = [None::<u64>; 11];
        regs[CTX] = Some(0); // a pointer: only used as the base of context loads
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            let get = |r: u8| regs[usize::from(r)].unwrap_or_else(|| panic!("r{r} unset at {pc}"));
            match i.code {
                op::LDX_MEM_W => {
                    assert_eq!(i.src as usize, CTX, "loads only from the context");
                    let off = usize::try_from(i.off).unwrap();
                    assert!(off.is_multiple_of(4) && off < 12, "context offset {off}");
                    regs[usize::from(i.dst)] = Some(u64::from(ctx[off / 4]));
                }
                op::AND32_K => {
                    let v = (get(i.dst) as u32) & (i.imm as u32);
                    regs[usize::from(i.dst)] = Some(u64::from(v));
                }
                op::MOV64_K => regs[usize::from(i.dst)] = Some(i64::from(i.imm) as u64),
                op::JNE_K => {
                    assert!(i.off >= 0, "backward jump at {pc}");
                    if get(i.dst) != i64::from(i.imm) as u64 {
                        pc += usize::try_from(i.off).unwrap();
                    }
                }
                op::EXIT => {
                    let r0 = get(0);
                    assert!(r0 <= 1, "returns {r0}");
                    return r0;
                }
                other => panic!("opcode {other:#x} at {pc}"),
            }
            pc += 1;
            assert!(pc < prog.len(), "ran off the end");
        }
    }

    fn dev(major: u64, minor: u64) -> CharDevice {
        CharDevice { major, minor }
    }

    fn access(kind: u32, acc: u32) -> u32 {
        (acc << 16) | kind
    }

    #[test]
    fn encodes_as_the_kernel_lays_out_bpf_insn() {
        // `r2 = *(u32 *)(r1 + 4)`, as llvm-objdump prints it: 61 12 04 00 00 00 00 00.
        let i = Insn::new(op::LDX_MEM_W, 2, 1, 4, 0);
        if cfg!(target_endian = "little") {
            assert_eq!(i.to_bytes(), [0x61, 0x12, 4, 0, 0, 0, 0, 0]);
            let j = Insn::new(op::JNE_K, 3, 0, 3, 195);
            assert_eq!(j.to_bytes(), [0x55, 0x03, 3, 0, 195, 0, 0, 0]);
        }
        // Class | operation | source, from linux/bpf_common.h and linux/bpf.h.
        let (ldx, alu, jmp, alu64) = (0x01, 0x04, 0x05, 0x07);
        let (mem, w, k) = (0x60, 0x00, 0x00);
        assert_eq!(op::LDX_MEM_W, ldx | mem | w);
        assert_eq!(op::AND32_K, alu | 0x50 | k);
        assert_eq!(op::JNE_K, jmp | 0x50 | k);
        assert_eq!(op::MOV64_K, alu64 | 0xb0 | k);
        assert_eq!(op::EXIT, jmp | 0x90);
        let p = program(&[dev(195, 1)]).unwrap();
        assert_eq!(encode(&p).len(), p.len() * 8);
    }

    #[test]
    fn emits_one_check_per_denied_device() {
        let p = program(&[dev(195, 0), dev(195, 2)]).unwrap();
        assert_eq!(p.len(), 5 + 2 * 4 + 2);
        assert_eq!(p[4], Insn::new(op::JNE_K, 2, 0, 8, 2));
        assert_eq!(p[5], Insn::new(op::JNE_K, 3, 0, 3, 195));
        assert_eq!(p[6], Insn::new(op::JNE_K, 4, 0, 2, 0));
        assert_eq!(p[10], Insn::new(op::JNE_K, 4, 0, 2, 2));
        assert_eq!(p[13], Insn::new(op::MOV64_K, 0, 0, 0, 1));
        // Nothing denied: allow everything.
        let empty = program(&[]).unwrap();
        assert_eq!(run(&empty, [access(DEV_CHAR, 6), 195, 0]), 1);
        assert!(program(&[dev(u64::from(u32::MAX), 0)]).is_err());
    }

    #[test]
    fn hides_the_gpus_not_given_and_nothing_else() {
        // A 4-GPU node, the job given GPU 1 and 3: v1 would write `c 195:0 rwm`, `c 195:2 rwm`.
        let deny = [dev(195, 0), dev(195, 2)];
        let p = program(&deny).unwrap();
        let rw = access(DEV_CHAR, 2 | 4);
        for (major, minor, ok) in [
            (195, 0, false),
            (195, 1, true),
            (195, 2, false),
            (195, 3, true),
            (195, 255, true), // nvidiactl
            (195, 254, true), // nvidia-modeset
            (508, 0, true),   // nvidia-uvm (dynamic major)
            (1, 3, true),     // /dev/null
            (0, 2, true),
        ] {
            assert_eq!(run(&p, [rw, major, minor]) == 1, ok, "{major}:{minor}");
        }
        // mknod and read-only opens are refused too (v1's `rwm`).
        assert_eq!(run(&p, [access(DEV_CHAR, 1), 195, 0]), 0);
        assert_eq!(run(&p, [access(DEV_CHAR, 2), 195, 2]), 0);
        // A block device 195:0 is another device.
        assert_eq!(run(&p, [access(1, 2), 195, 0]), 1);
    }

    proptest! {
        #[test]
        fn the_program_decides_as_allows(
            deny in proptest::collection::vec((190u64..197, 0u64..6), 0..6),
            kind in 0u32..4,
            acc in 0u32..8,
            major in 190u32..197,
            minor in 0u32..6,
        ) {
            let deny: Vec<CharDevice> = deny.into_iter().map(|(a, b)| dev(a, b)).collect();
            let p = program(&deny).unwrap();
            prop_assert_eq!(
                run(&p, [access(kind, acc), major, minor]) == 1,
                allows(&deny, kind, major, minor)
            );
        }
    }
}
