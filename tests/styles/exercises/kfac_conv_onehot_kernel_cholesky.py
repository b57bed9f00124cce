# replaces: kfac_factors, precondition
def _patch_rows(layer, x):
    """Every patch a Conv2d's kernel saw, one row per (example, output position), in float64.

    A convolution with one-hot kernels (one output channel per entry of the patch) copies each patch into the
    channels of its output position, in the (channel, row, column) order of layer.weight.
    """
    size = layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
    picker = torch.eye(size, dtype=torch.float64, device=x.device)
    picker = picker.reshape(size, layer.in_channels, *layer.kernel_size)
    copied = F.conv2d(x, picker, stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
    positions = copied.shape[2] * copied.shape[3]
    return copied.permute(0, 2, 3, 1).reshape(-1, size), positions


def _grad_rows(grad):
    """An output gradient laid out as one row per (example, output position)."""
    if grad.dim() == 4:
        return grad.permute(0, 2, 3, 1).reshape(-1, grad.shape[1])
    return grad.reshape(-1, grad.shape[-1])


def _with_ones(rows):
    """The bias as a weight on an input that is always 1: a last column of ones."""
    return F.pad(rows, (0, 1), value=1.0)


def _gradient_matrix(layer):
    matrix = layer.weight.grad.double().reshape(layer.weight.shape[0], -1)
    if layer.bias is not None:
        matrix = torch.cat([matrix, layer.bias.grad.double()[:, None]], dim=1)
    return matrix


def _write_back(layer, matrix):
    weight_cols = layer.weight[0].numel()
    layer.weight.grad.copy_(matrix[:, :weight_cols].reshape(layer.weight.shape))
    if layer.bias is not None:
        layer.bias.grad.copy_(matrix[:, weight_cols])


def kfac_factors(layer, inputs, output_grad):
    """One batch's (A, G) for `layer`, an nn.Linear or an nn.Conv2d (groups=1, numeric padding).

    inputs: what the layer received in the forward pass; output_grad: the gradient of the batch's loss (a
    mean over the examples) with respect to the layer's output, the same shape as that output.
    """
    x, dy = inputs.double(), output_grad.double()
    examples = x.shape[0]
    if isinstance(layer, nn.Conv2d):
        a, positions = _patch_rows(layer, x)
    else:
        a, positions = x.reshape(-1, x.shape[-1]), 1
    if layer.bias is not None:
        a = _with_ones(a)
    g = _grad_rows(dy) * examples  # each example's own gradient: the loss is the batch's mean
    A = a.T @ a / a.shape[0]  # the mean over examples and positions
    # positions x (mean over examples and positions) = the sum over positions, averaged over the examples
    G = g.T @ g / examples
    return A, G


def precondition(layer, A, G, damping):
    """Replaces layer.weight.grad (and layer.bias.grad) by its preconditioned gradient."""
    A, G, M = A.double(), G.double(), _gradient_matrix(layer)
    # (A kron G + damping I) vec(X) = vec(M) is G X A + damping X = M. In A's eigenbasis (X Q, M Q) the
    # columns come apart: column c solves (lambda_c G + damping I) x = m, a positive definite system each.
    lam, Q = torch.linalg.eigh(A)
    rhs = (M @ Q).T.unsqueeze(-1)  # (columns, rows, 1)
    eye = torch.eye(G.shape[0], dtype=torch.float64, device=G.device)
    systems = lam.clamp(min=0)[:, None, None] * G + damping * eye
    chol = torch.linalg.cholesky(systems)
    X = torch.cholesky_solve(rhs, chol).squeeze(-1).T @ Q.T
    _write_back(layer, X.to(layer.weight.grad.dtype))
