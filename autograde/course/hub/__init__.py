"""A class on a JupyterHub: the settings of deploy/jupyterhub/ and the code its configuration uses.

    settings.py  the class's settings file (deploy/jupyterhub/class.toml): who teaches, who learns,
                 which spawner, the limits; read and checked once, with one-line errors
    limits.py    each learner's share of the node: GPUs (CUDA_VISIBLE_DEVICES) and a cgroup with a
                 memory, CPU and process limit
    spawners.py  the two spawners: a local process per Unix user, or a SLURM job (batchspawner)
    start.py     what runs as the class member, before their server: the first login's copy of the
                 course, the instructor's course folder and tools

The hub itself runs as root (it starts servers as other users): `make hub` (docs/instructors.md).
"""
