//! Tandem's scheduling core: pure, deterministic model of jobs, nodes, TRES, partitions, QOS, accounts, priority, fair share, backfill and preemption; time is an argument.
