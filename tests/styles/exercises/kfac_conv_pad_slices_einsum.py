# replaces: kfac_factors, precondition
def kfac_factors(layer, inputs, output_grad):
    """One batch's (A, G) for `layer`, an nn.Linear or an nn.Conv2d (groups=1, numeric padding).

    inputs: what the layer received in the forward pass; output_grad: the gradient of the batch's loss (a
    mean over the examples) with respect to the layer's output, the same shape as that output.
    """
    n = inputs.shape[0]
    grads = output_grad * n  # per-example gradients (the loss averaged over the batch)
    if isinstance(layer, nn.Conv2d):
        (kh, kw), (sh, sw) = layer.kernel_size, layer.stride
        (ph, pw), (dh, dw) = layer.padding, layer.dilation
        padded = F.pad(inputs, (pw, pw, ph, ph))
        # windows along height then width: (n, c, out_h, out_w, span_h, span_w), then keep the dilated taps
        windows = padded.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)
        windows = windows[..., ::dh, ::dw]
        out_h, out_w = windows.shape[2], windows.shape[3]
        # a patch per (example, y, x), its entries ordered (channel, ky, kx) like weight.view(out, -1)
        patches = windows.permute(0, 2, 3, 1, 4, 5).reshape(n, out_h, out_w, -1)
        if layer.bias is not None:
            patches = torch.cat([patches, patches.new_ones(n, out_h, out_w, 1)], dim=-1)
        count = out_h * out_w
        # the positions' count goes into A here; G keeps a plain mean over examples and positions
        A = count * torch.einsum("nyxi,nyxj->ij", patches, patches) / (n * count)
        G = torch.einsum("niyx,njyx->ij", grads, grads) / (n * count)
        return A, G
    x = inputs.reshape(-1, inputs.shape[-1])
    if layer.bias is not None:
        x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
    dy = grads.reshape(-1, grads.shape[-1])
    return torch.einsum("bi,bj->ij", x, x) / x.shape[0], torch.einsum("bi,bj->ij", dy, dy) / dy.shape[0]


def precondition(layer, A, G, damping):
    """Replaces layer.weight.grad (and layer.bias.grad) by its preconditioned gradient."""
    has_bias = layer.bias is not None
    out = layer.weight.shape[0]
    m = layer.weight.grad.reshape(out, -1)
    if has_bias:
        m = torch.cat([m, layer.bias.grad.unsqueeze(1)], dim=1)
    m = m.double()
    A, G = A.double(), G.double()
    # Solve G X A + damping X = M. Rotating the rows into G's eigenbasis decouples them: row r of the
    # rotated X solves x (mu_r A + damping I) = row r of the rotated M, one small system per output.
    mu, q = torch.linalg.eigh(G)
    rotated = q.T @ m
    eye = torch.eye(A.shape[0], dtype=A.dtype)
    systems = mu.clamp(min=0).view(-1, 1, 1) * A + damping * eye  # (out, columns, columns)
    solved = torch.linalg.solve(systems, rotated.unsqueeze(-1)).squeeze(-1)
    x = (q @ solved).to(layer.weight.grad.dtype)
    n_weight = x.shape[1] - 1 if has_bias else x.shape[1]
    layer.weight.grad.copy_(x[:, :n_weight].reshape(layer.weight.grad.shape))
    if has_bias:
        layer.bias.grad.copy_(x[:, n_weight])
