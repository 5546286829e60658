//! The tandem binary: controller, worker, all-in-one cluster and the Slurm commands (sbatch, squeue, ...) by argv[0].
