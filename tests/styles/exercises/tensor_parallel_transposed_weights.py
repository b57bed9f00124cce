# replaces: CopyToParallel, ReduceFromParallel, ColumnParallelLinear, RowParallelLinear, ParallelMLP, make_groups, average_gradients
def copy_to_parallel(x, group):
    return CopyToParallel.apply(x, group)


def reduce_from_parallel(x, group):
    return ReduceFromParallel.apply(x, group)


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        summed = grad.detach().clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        out = x.detach().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None


def my_range(features, group):
    """(first, count) of this rank's block of `features`."""
    count = features // dist.get_world_size(group)
    return dist.get_rank(group) * count, count


class ColumnParallelLinear(nn.Module):
    """The weight kept as (in, out/N), so that the layer is x @ W + b."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        first, count = my_range(linear.out_features, group)
        w = linear.weight.detach().t().narrow(1, first, count)
        self.w = nn.Parameter(w.contiguous().clone())
        if linear.bias is not None:
            self.b = nn.Parameter(linear.bias.detach().narrow(0, first, count).clone())
        else:
            self.b = None

    def forward(self, x):
        y = copy_to_parallel(x, self.group) @ self.w
        return y if self.b is None else y + self.b


class RowParallelLinear(nn.Module):
    """The weight kept as (in/N, out); the bias on the group's rank 0 only, added before the sum."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        first, count = my_range(linear.in_features, group)
        self.w = nn.Parameter(linear.weight.detach().t().narrow(0, first, count).contiguous().clone())
        self.b = None
        if linear.bias is not None and dist.get_rank(group) == 0:
            self.b = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        partial = x @ self.w
        if self.b is not None:
            partial = partial + self.b  # one rank adds it: the sum holds it once
        return reduce_from_parallel(partial, self.group)


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.layers = nn.ModuleList([ColumnParallelLinear(fc1, group), RowParallelLinear(fc2, group)])

    def forward(self, x):
        first, second = self.layers
        return second(F.gelu(first(x)))


def make_groups(tensor_parallel):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    grid = [[row * tensor_parallel + col for col in range(tensor_parallel)]
            for row in range(world_size // tensor_parallel)]
    row_groups = [dist.new_group(row) for row in grid]
    col_groups = [dist.new_group(list(col)) for col in zip(*grid)]
    return row_groups[rank // tensor_parallel], col_groups[rank % tensor_parallel]


def average_gradients(model, group):
    n = dist.get_world_size(group)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for g in grads:
        dist.all_reduce(g, group=group)
    for g in grads:
        g.mul_(1.0 / n)
