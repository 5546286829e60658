//! Links `tandem-slurm` (sbatch, squeue, ... by argv[0]) as a position-dependent executable,
//! and both of this package's binaries with the unwinder linked in.
//!
//! A position-independent executable is relocated by the dynamic loader at every start:
//! this one's 12,700 relative relocations, and a private copy of every page of vtables and
//! string tables they patch. For a command a researcher's shell loop starts hundreds of
//! times that was 0.3 ms of its 2.3 ms of CPU per call (measured: held `sbatch` CPU 2.31 ->
//! 2.02 ms, wall 3.43 -> 3.14 ms, alternating builds in one run). Linked at a fixed
//! address, the loader has nothing to patch and the pages stay shared with the page cache.
//!
//! The cost is address-space randomisation of the command's own code. The commands run
//! with the invoking user's rights only (no set-uid, no capabilities) and exit within
//! milliseconds. The job launcher (`tandem-slurm __job-exec`) runs as root for the moment
//! between its exec and dropping to the job's user, reading only a request file the worker
//! wrote into its own mode-0700 directory. The daemons (`tandem` controller, worker,
//! identity agent), which hold the cluster key and serve the network, stay
//! position-independent.
//!
//! Both binaries also carry the unwinder (`libgcc_eh`, the static half of `libgcc_s`)
//! instead of loading `libgcc_s.so.1`: one shared object fewer to open, map and relocate,
//! and no run of its constructor, which probes the CPU with `cpuid` (an exit to the
//! hypervisor on a virtual machine). Measured on the 2-core VM, calls alternating between
//! builds, 300 each: `sbatch --version` 0.76 -> 0.65 ms of CPU, held `sbatch` 2.54 -> 2.42 ms,
//! running 3.37 -> 3.15 ms. Rust code links it the same way on targets without a shared
//! `libgcc_s` (musl); it unwinds panics as before.

fn main() {
    // Only where the toolchain links through a C compiler driver that knows the flag (GNU
    // and LLVM toolchains on Linux); elsewhere the default stays.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=tandem-slurm=-no-pie");
        // Static, and not bundled into the rlib: the link line names it before std's
        // `-lgcc_s`, so `--as-needed` finds nothing left for the shared one.
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
