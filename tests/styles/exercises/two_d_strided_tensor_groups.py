# replaces: make_groups
def make_groups(tensor_parallel):
    """The other layout: the ranks of a tensor group are world_size // tensor_parallel apart
    ({0, 2} and {1, 3} on 4 ranks), and the data groups are the neighbours ({0, 1} and {2, 3})."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    replicas = world_size // tensor_parallel
    tensor_group = data_group = None
    for r in range(replicas):
        ranks = [r + replicas * k for k in range(tensor_parallel)]
        group = dist.new_group(ranks)
        if rank in ranks:
            tensor_group = group
    for k in range(tensor_parallel):
        ranks = [k * replicas + r for r in range(replicas)]
        group = dist.new_group(ranks)
        if rank in ranks:
            data_group = group
    return tensor_group, data_group
