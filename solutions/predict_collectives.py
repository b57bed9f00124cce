"""Predict, then run: what every rank's buffer holds after a collective.

Four processes, ranks 0 to 3, each start with a buffer of two numbers:

    buffer = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])    # rank 0: [1, 10], rank 1: [2, 20], ...

For each call below, write down what every rank holds afterwards: a list of four lists, rank 0's
first. Then check (autograde.assert_step("predict"), or make check STEP=predict): the check makes
the calls for real on 4 processes and compares them with your predictions. Notebook
10_collectives.ipynb draws every call before and after, once you have predicted.
"""

PREDICTIONS = {
    # predict: dist.broadcast(buffer, src=2)
    "broadcast": [[3, 30], [3, 30], [3, 30], [3, 30]],
    # predict: dist.all_reduce(buffer)    (the default operation is a sum)
    "all_reduce": [[10, 100], [10, 100], [10, 100], [10, 100]],
    # predict: dist.all_reduce(buffer, op=dist.ReduceOp.MAX)
    "all_reduce_max": [[4, 40], [4, 40], [4, 40], [4, 40]],
    # predict: out = [torch.zeros(2) for _ in range(4)]; dist.all_gather(out, buffer)
    # (write each rank's `out` as one list: torch.cat(out))
    "all_gather": [[1, 10, 2, 20, 3, 30, 4, 40]] * 4,
    # predict: pieces = [[100, 101], [102, 103], [104, 105], [106, 107]] (tensors, on rank 0 only)
    # dist.scatter(buffer, pieces if rank == 0 else None, src=0)
    "scatter": [[100, 101], [102, 103], [104, 105], [106, 107]],
    # predict: big = torch.arange(1.0, 9.0) * (rank + 1)    (rank 1: [2, 4, ..., 16])
    # dist.reduce_scatter(buffer, list(big.chunk(4)))
    "reduce_scatter": [[10, 20], [30, 40], [50, 60], [70, 80]],
}
