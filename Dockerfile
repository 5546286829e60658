# The one Tandem image: `tandem` (controller, worker, authd, login CLI), `tandem-slurm` (the
# Slurm commands and the job launcher alone, quick to exec), `tandem-operator` and
# `tandem-bridge`, with the Slurm command names as links to `tandem-slurm`. The operator
# runs the controller, worker and login pods from it; the charts run the operator and the
# bridge from it. e2e/tests/packaging.rs checks this file against the workspace.
#
#   docker build -t ghcr.io/tandem-dev/tandem:0.1.0 .

# ---- build ----
FROM rust:1.89-bookworm AS builder
WORKDIR /src
COPY . .
# protox compiles the .proto files in Rust and rusqlite bundles SQLite: the Rust image's
# C compiler is all the build needs.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p tandem-cli -p tandem-operator -p tandem-bridge --bins \
    && mkdir -p /out \
    && cp target/release/tandem target/release/tandem-slurm target/release/tandem-operator \
        target/release/tandem-bridge /out/

# ---- runtime ----
FROM debian:bookworm-slim
# python3: example jobs (examples/batch) run it on the workers; procps: ps and kill in job
# scripts; ca-certificates for the registries and object stores jobs talk to.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates procps \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/tandem /usr/local/bin/tandem
COPY --from=builder /out/tandem-slurm /usr/local/bin/tandem-slurm
COPY --from=builder /out/tandem-operator /usr/local/bin/tandem-operator
COPY --from=builder /out/tandem-bridge /usr/local/bin/tandem-bridge
# The Slurm command names (`tandem links` makes the same set): tandem-slurm dispatches on
# argv[0]. The worker finds tandem-slurm beside tandem and starts jobs through it.
RUN cd /usr/local/bin \
    && for name in sbatch squeue scancel sinfo sacct scontrol srun sacctmgr sshare sprio; do \
        ln -s tandem-slurm "$name"; \
    done
# A fixed non-root uid/gid (the charts' runAsUser), and the directories the pods mount over.
RUN groupadd --gid 65532 tandem \
    && useradd --uid 65532 --gid 65532 --home-dir /var/lib/tandem --shell /bin/bash tandem \
    && mkdir -p /var/lib/tandem /var/spool/tandem /run/tandem /etc/tandem \
    && chown tandem:tandem /var/lib/tandem /var/spool/tandem /run/tandem
USER 65532:65532
WORKDIR /var/lib/tandem
# Pods name their command (`tandem worker`, `tandem-operator run`, ...); bare, the image is
# the CLI.
ENTRYPOINT ["tandem"]
CMD ["--help"]
