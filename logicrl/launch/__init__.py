"""Launching logicrl runs on clusters: SLURM jobs (slurm.py, behind slurm/train.sbatch) and sweeps
(sweep.py: job names, checks before the first job, the summary in sweep_summary.py)."""
