# replaces: make_groups
def make_groups(tensor_parallel):
    """torch's helper makes every group on every rank and returns the one this rank is in."""
    world_size = dist.get_world_size()
    tensor_ranks = [list(range(s, s + tensor_parallel)) for s in range(0, world_size, tensor_parallel)]
    data_ranks = [list(range(o, world_size, tensor_parallel)) for o in range(tensor_parallel)]
    tensor_group, _ = dist.new_subgroups_by_enumeration(tensor_ranks)
    data_group, _ = dist.new_subgroups_by_enumeration(data_ranks)
    return tensor_group, data_group
