"""Predictions made by walking through the lives one by one: a list of (world size, failures so far)."""
NODES = {"A": "127.0.0.1", "B": "127.0.0.2"}


def _rank(node, nodes_in_group):
    return sorted(NODES[n] for n in nodes_in_group).index(NODES[node])


def node_joins(epochs, after_epoch):
    lives = [(1, 0)]  # A alone
    lives.append((2, lives[-1][1]))  # B arrives: a new round, nothing failed
    return {"world_sizes": [size for size, _ in lives], "restarts": [failures for _, failures in lives],
            "resumes_at": after_epoch + 1, "rank_of_b": _rank("B", ["A", "B"])}


def node_lost(epochs, after_epoch):
    lives = [(2, 0)]
    lives.append((1, lives[-1][1] + 1))  # the survivor's worker failed: counted
    saved = after_epoch  # the last checkpoint written before B died
    return {"world_sizes": [size for size, _ in lives], "restarts": [failures for _, failures in lives],
            "resumes_at": saved + 1, "rank_of_a": _rank("A", ["A"])}


if __name__ == "__main__":
    print(node_joins(6, 1), node_lost(6, 2))
