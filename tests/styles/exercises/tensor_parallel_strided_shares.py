# replaces: CopyToParallel, ReduceFromParallel, ColumnParallelLinear, RowParallelLinear, ParallelMLP, make_groups, average_gradients
class CopyToParallel(torch.autograd.Function):
    """f: identity forward, sum of the ranks' gradients backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        total = grad_output.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        return total, None


class ReduceFromParallel(torch.autograd.Function):
    """g: sum of the ranks' partial results forward, identity backward."""

    @staticmethod
    def forward(ctx, partial, group=None):
        total = partial.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class ColumnParallelLinear(nn.Module):
    """Every N-th output feature, starting at this rank's: rows rank, rank + N, rank + 2N, ..."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        step, first = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[first::step].clone())
            self.bias = nn.Parameter(linear.bias[first::step].clone()) if linear.bias is not None else None

    def forward(self, x):
        x = CopyToParallel.apply(x, self.group)
        out = x @ self.weight.t()
        if self.bias is not None:
            out = out + self.bias
        return out


class RowParallelLinear(nn.Module):
    """Every N-th input feature, starting at this rank's: the columns the column layer's outputs are."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.group = group
        step, first = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight[:, first::step].clone())
            self.bias = nn.Parameter(linear.bias.clone()) if linear.bias is not None else None

    def forward(self, x):
        partial = x @ self.weight.t()
        out = ReduceFromParallel.apply(partial, self.group)
        if self.bias is not None:
            out = out + self.bias
        return out


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.up = ColumnParallelLinear(fc1, group)
        self.down = RowParallelLinear(fc2, group)

    def forward(self, x):
        hidden = self.up(x)
        return self.down(F.gelu(hidden))


def make_groups(tensor_parallel):
    world_size, rank = dist.get_world_size(), dist.get_rank()
    tensor_group = data_group = None
    for start in range(0, world_size, tensor_parallel):
        ranks = list(range(start, start + tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            tensor_group = group
    for offset in range(tensor_parallel):
        ranks = list(range(offset, world_size, tensor_parallel))
        group = dist.new_group(ranks)
        if rank in ranks:
            data_group = group
    return tensor_group, data_group


def average_gradients(model, group):
    replicas = dist.get_world_size(group)
    for parameter in model.parameters():
        if parameter.grad is None:
            continue
        parameter.grad.div_(replicas)  # dividing first gives the same average
        dist.all_reduce(parameter.grad, group=group)
