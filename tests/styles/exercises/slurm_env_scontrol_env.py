# replaces: torch_env_from_slurm
def torch_env_from_slurm(environ):
    """scontrol reading the node list from its environment; local rank from the global one; a
    port in the upper range."""
    env = {**os.environ, **environ}  # scontrol show hostnames, with no list, reads SLURM_JOB_NODELIST
    first = subprocess.check_output(["scontrol", "show", "hostnames"], env=env, text=True).splitlines()[0]
    rank = int(environ["SLURM_PROCID"])
    per_node = int(environ["SLURM_NTASKS_PER_NODE"])
    out = dict(RANK=rank, LOCAL_RANK=rank % per_node, WORLD_SIZE=environ["SLURM_NTASKS"],
               LOCAL_WORLD_SIZE=per_node, MASTER_ADDR=first,
               MASTER_PORT=1024 + int(environ["SLURM_JOBID"]) % (65536 - 1024))
    return {key: str(value) for key, value in out.items()}
