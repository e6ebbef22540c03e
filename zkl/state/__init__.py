"""A run directory's state: the checkpoint and resume from it, the run lock, Slurm requeue."""
