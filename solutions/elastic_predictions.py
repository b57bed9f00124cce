"""Elastic torchrun: predict what the group does when a node joins, and when one is lost.

Notebook 15's section "Elastic: nodes that come and go" runs exercises/resume_training.py under
`torchrun --nnodes 1:2 --max-restarts 3` on two "nodes" of this machine, one process each (node A
hosts the rendezvous). Before it runs, write down what you expect, as two functions of the
scenario. `make check STEP=elastic` calls them for several scenarios and compares what they say
with what the course's real runs of those scenarios measured (tests/parts/launching/test_elastic.py
runs them for real, on every `make test`).

A *life* of the group is what one rendezvous round starts: a set of workers with one world size,
running until they stop. Each function returns a dict with these keys:

    "world_sizes": the world size of each life, in order (a list of ints)
    "restarts":    torchrun's count of failures in each life, in order, as the workers read it
                   in TORCHELASTIC_RESTART_COUNT (a list of ints)
    "resumes_at":  the first epoch the last life trains (an int)
    "rank_of_b" / "rank_of_a": the rank node B's / node A's worker holds in the last life (an int)
"""


def node_joins(epochs, after_epoch):
    """Node A starts alone (one node is enough: --nnodes 1:2) to train `epochs` epochs, saving a
    checkpoint after each; node B is started once A's rank 0 has finished epoch `after_epoch`,
    while A goes on training (an epoch takes about as long as B takes to start). What the group
    does: world_sizes, restarts, resumes_at (the earliest it can be), rank_of_b."""
    # TODO elastic: your prediction for a node that joins.
    return {
        "world_sizes": [1, 2],  # B waits for the next round: A's worker is stopped and both start again
        "restarts": [0, 0],  # a node that joins is no failure
        "resumes_at": after_epoch + 1,  # from the checkpoint of epoch after_epoch, at the earliest
        "rank_of_b": 1,  # the round hands out ranks in the order of the nodes' addresses: A's is lower
    }


def node_lost(epochs, after_epoch):
    """Nodes A and B start together to train `epochs` epochs, saving a checkpoint after each;
    once rank 0 has finished epoch `after_epoch` (and saved it), every process of node B is
    killed. What the group does: world_sizes, restarts, resumes_at, rank_of_a."""
    # TODO elastic: your prediction for a node that is lost.
    return {
        "world_sizes": [2, 1],  # the survivor goes on alone: one node is enough
        "restarts": [0, 1],  # A's worker failed in its next collective: a failure
        "resumes_at": after_epoch + 1,  # epoch after_epoch was saved before B died
        "rank_of_a": 0,
    }
