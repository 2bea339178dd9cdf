"""Launching logicrl runs on clusters: SLURM jobs (slurm.py) and sweeps."""
