# replaces: torch_env_from_slurm
def torch_env_from_slurm(environ):
    """Only the first host is needed: the first name outside brackets, each bracket replaced by
    the first number in it; tasks per node read from SLURM_TASKS_PER_NODE ("2(x4)", or "2,2")."""
    import re

    nodelist = environ["SLURM_JOB_NODELIST"]
    depth, end = 0, len(nodelist)
    for k, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = k
            break
    first = re.sub(r"\[(\d+)[^\]]*\]", r"\1", nodelist[:end])
    tasks_per_node = re.match(r"\d+", environ["SLURM_TASKS_PER_NODE"]).group()
    env = {}
    env["RANK"] = environ["SLURM_PROCID"]
    env["LOCAL_RANK"] = environ["SLURM_LOCALID"]
    env["WORLD_SIZE"] = environ["SLURM_NTASKS"]
    env["LOCAL_WORLD_SIZE"] = tasks_per_node
    env["MASTER_ADDR"] = first
    env["MASTER_PORT"] = f"{30000 + int(environ['SLURM_JOB_ID']) % 10000}"
    return env
