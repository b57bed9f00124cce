# replaces: RowParallelLinear
class RowParallelLinear(nn.Module):
    """Every rank keeps the whole bias (simple to save and load), but only the group's first rank adds
    it, to its partial sum: the all-reduce then carries it once. The others never use theirs."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        per_rank = linear.in_features // size
        columns = linear.weight.detach()[:, rank * per_rank:(rank + 1) * per_rank]
        self.weight = nn.Parameter(columns.clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.adds_bias = rank == 0

    def forward(self, x):
        partial = x @ self.weight.t()
        if self.bias is not None and self.adds_bias:
            partial = partial + self.bias
        return ReduceFromParallel.apply(partial, self.group)
