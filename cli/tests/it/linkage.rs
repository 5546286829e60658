//! How `tandem-slurm` (every `sbatch`, `squeue`, ... a researcher runs) is linked: each
//! shared library it needs is one the loader opens, maps and relocates at every command,
//! and a position-independent executable is relocated at every start (`cli/build.rs`).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use object::elf;
use object::read::elf::{ElfFile64, FileHeader as _};

/// The shared objects the binary names (`DT_NEEDED`), and whether it is position-dependent.
fn linkage(path: &str) -> (Vec<String>, bool) {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file: ElfFile64 = ElfFile64::parse(&*data).unwrap();
    let endian = file.endian();
    let fixed = file.elf_header().e_type(endian) == elf::ET_EXEC;
    let table = file.elf_dynamic_table().unwrap();
    let needed = table
        .iter()
        .filter(|d| d.tag == elf::DT_NEEDED)
        .map(|d| String::from_utf8_lossy(table.string(d).unwrap()).into_owned())
        .collect();
    (needed, fixed)
}

#[test]
fn the_slurm_commands_load_only_the_c_library() {
    let (needed, fixed) = linkage(env!("CARGO_BIN_EXE_tandem-slurm"));
    let extra: Vec<&String> = needed
        .iter()
        .filter(|n| !(n.starts_with("libc.so") || n.starts_with("ld-linux")))
        .collect();
    assert!(
        extra.is_empty(),
        "tandem-slurm needs {extra:?} beyond the C library (libm: define the function in \
         src/bin/tandem-slurm.rs; libgcc_s: see build.rs); all: {needed:?}"
    );
    assert!(
        fixed,
        "tandem-slurm is linked position-dependent (build.rs)"
    );
}

#[test]
fn the_daemons_stay_position_independent() {
    let (_, fixed) = linkage(env!("CARGO_BIN_EXE_tandem"));
    assert!(!fixed, "tandem (controller, worker, agent) must stay a PIE");
}
