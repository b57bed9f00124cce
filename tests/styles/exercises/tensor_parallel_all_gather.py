# replaces: CopyToParallel, ReduceFromParallel, ColumnParallelLinear, RowParallelLinear, ParallelMLP, make_groups, average_gradients
def _gather_sum(t, group):
    """The sum of `t` over the ranks of `group`, through all_gather."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts).sum(dim=0)


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _gather_sum(grad, ctx.group), None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        return _gather_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """An nn.Linear of its own, out_features/N wide, copied from rows [start, stop) of the whole one."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        per_rank = linear.out_features // dist.get_world_size(group)
        start = dist.get_rank(group) * per_rank
        stop = start + per_rank
        self.linear = nn.Linear(linear.in_features, per_rank, bias=linear.bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight[start:stop])
            if linear.bias is not None:
                self.linear.bias.copy_(linear.bias[start:stop])

    def forward(self, x):
        return self.linear(CopyToParallel.apply(x, self.group))


class RowParallelLinear(nn.Module):
    """An nn.Linear of its own without bias, in_features/N wide; the bias added once, after the sum."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        per_rank = linear.in_features // dist.get_world_size(group)
        start = dist.get_rank(group) * per_rank
        self.linear = nn.Linear(per_rank, linear.out_features, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight[:, start:start + per_rank])
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x):
        y = ReduceFromParallel.apply(self.linear(x), self.group)
        if self.bias is not None:
            y = y + self.bias
        return y


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.net = nn.Sequential(ColumnParallelLinear(fc1, group), nn.GELU(), RowParallelLinear(fc2, group))

    def forward(self, x):
        return self.net(x)


def make_groups(tensor_parallel):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    found = {}
    for start in range(0, world_size, tensor_parallel):
        ranks = list(range(start, start + tensor_parallel))
        found[tuple(ranks)] = dist.new_group(ranks)
    for offset in range(tensor_parallel):
        ranks = list(range(offset, world_size, tensor_parallel))
        found[tuple(ranks)] = dist.new_group(ranks)
    start = rank - rank % tensor_parallel
    tensor_ranks = tuple(range(start, start + tensor_parallel))
    data_ranks = tuple(range(rank % tensor_parallel, world_size, tensor_parallel))
    return found[tensor_ranks], found[data_ranks]


def average_gradients(model, group):
    for p in model.parameters():
        if p.grad is not None:
            p.grad = _gather_sum(p.grad, group) / dist.get_world_size(group)
