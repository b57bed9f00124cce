# replaces: torch_env_from_slurm
def torch_env_from_slurm(environ):
    """The node list expanded by hand (no scontrol); ranks from the node's number and the local one."""
    import re

    def expand(nodelist):
        names, depth, item = [], 0, ""
        for char in nodelist + ",":
            depth += {"[": 1, "]": -1}.get(char, 0)
            if char == "," and depth == 0:
                names += expand_one(item)
                item = ""
            else:
                item += char
        return names

    def expand_one(item):
        match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            return [item]
        prefix, ranges, rest = match.groups()
        numbers = []
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]
        return [prefix + n + tail for n in numbers for tail in expand_one(rest)]

    per_node = int(environ["SLURM_NTASKS_PER_NODE"])
    node, local = int(environ["SLURM_NODEID"]), int(environ["SLURM_LOCALID"])
    job = int(environ["SLURM_JOB_ID"])
    return {
        "RANK": str(node * per_node + local),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(int(environ["SLURM_NNODES"]) * per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
        "MASTER_ADDR": expand(environ["SLURM_JOB_NODELIST"])[0],
        "MASTER_PORT": str(29500 + job % 1000),
    }
