"""Real clusters on one machine, for the parts that launch on them: SLURM (slurm.py) and Open MPI
(open_mpi.py), installed from Debian's packages (debian.py)."""
