# replaces: kfac_factors, precondition
def kfac_factors(layer, inputs, output_grad):
    """One batch's (A, G) for `layer`, an nn.Linear or an nn.Conv2d (groups=1, numeric padding).

    inputs: what the layer received in the forward pass; output_grad: the gradient of the batch's loss (a
    mean over the examples) with respect to the layer's output, the same shape as that output.
    """
    batch = output_grad.size(0)
    if isinstance(layer, nn.Conv2d):
        # (batch, in_channels * kh * kw, positions): a column of this per output position
        cols = F.unfold(inputs, kernel_size=layer.kernel_size, dilation=layer.dilation,
                        padding=layer.padding, stride=layer.stride)
        dout = output_grad.flatten(start_dim=2)  # (batch, out_channels, positions)
    else:
        cols = inputs.unsqueeze(2)  # a linear layer is one position
        dout = output_grad.unsqueeze(2)
    if layer.bias is not None:
        ones = torch.ones(cols.size(0), 1, cols.size(2), dtype=cols.dtype, device=cols.device)
        cols = torch.cat((cols, ones), dim=1)
    dout = dout * batch  # the loss is the batch's mean; each example's own gradient is batch times it
    positions = cols.size(2)
    samples = batch * positions
    # sum over positions per example with bmm, then over the examples; the positions' count is shared,
    # its square root in each factor
    A = torch.bmm(cols, cols.transpose(1, 2)).sum(dim=0) / samples * positions ** 0.5
    G = torch.bmm(dout, dout.transpose(1, 2)).sum(dim=0) / samples * positions ** 0.5
    return A, G


def precondition(layer, A, G, damping):
    """Replaces layer.weight.grad (and layer.bias.grad) by its preconditioned gradient."""
    weight_grad = layer.weight.grad
    parts = [weight_grad.flatten(start_dim=1)]
    if layer.bias is not None:
        parts.append(layer.bias.grad.view(-1, 1))
    grad = torch.cat(parts, dim=1).to(torch.float64)
    # A and G are symmetric positive semi-definite: their SVDs are eigendecompositions, U S U^T
    ua, sa, _ = torch.linalg.svd(A.to(torch.float64))
    ug, sg, _ = torch.linalg.svd(G.to(torch.float64))
    # (A kron G) has eigenvectors ug[:, r] (x) ua[:, c] and eigenvalues sg[r] * sa[c]
    inner = ug.T.matmul(grad).matmul(ua)
    inner = inner / (torch.outer(sg, sa) + damping)
    result = ug.matmul(inner).matmul(ua.T).to(weight_grad.dtype)
    weight_part, bias_part = result.split([parts[0].size(1), result.size(1) - parts[0].size(1)], dim=1)
    weight_grad.copy_(weight_part.view_as(weight_grad))
    if layer.bias is not None:
        layer.bias.grad.copy_(bias_part.view(-1))
