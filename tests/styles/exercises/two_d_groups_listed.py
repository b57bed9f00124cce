# replaces: make_groups
def make_groups(tensor_parallel):
    """Every group's ranks listed first, every group made (all ranks, same order), then this rank's picked."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tensor_lists = [list(range(i, i + tensor_parallel)) for i in range(0, world_size, tensor_parallel)]
    data_lists = [[t[position] for t in tensor_lists] for position in range(tensor_parallel)]
    tensor_groups = [dist.new_group(ranks) for ranks in tensor_lists]
    data_groups = [dist.new_group(ranks) for ranks in data_lists]
    (tensor_group,) = [g for g, ranks in zip(tensor_groups, tensor_lists) if rank in ranks]
    (data_group,) = [g for g, ranks in zip(data_groups, data_lists) if rank in ranks]
    return tensor_group, data_group
