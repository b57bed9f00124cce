# replaces: node_joins, node_lost
def _prediction(sizes, failures, first_epoch, rank_key, rank):
    return {"world_sizes": list(sizes), "restarts": list(failures), "resumes_at": first_epoch, rank_key: rank}


def node_joins(epochs, after_epoch):
    return _prediction([1, 2], [0] * 2, after_epoch + 1, "rank_of_b", 1)


def node_lost(epochs, after_epoch):
    return _prediction([2, 1], range(2), after_epoch + 1, "rank_of_a", 0)
