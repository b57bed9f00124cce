# replaces: Recompute, run_by_hand
class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, run):
        ctx.run, ctx.x = run, x.detach()
        return run(x)  # autograd records nothing inside a Function's forward

    @staticmethod
    def backward(ctx, grad_output):
        params = [p for p in ctx.run.parameters() if p.requires_grad]
        x = ctx.x.requires_grad_()
        with torch.enable_grad():
            y = ctx.run(x)
        grads = torch.autograd.grad(y, [x, *params], grad_output)
        for p, g in zip(params, grads[1:]):
            p.grad = g if p.grad is None else p.grad + g
        return grads[0], None


def run_by_hand(blocks, x, segments):
    out = x
    for first, last in runs_of(len(blocks), segments):
        out = Recompute.apply(out, nn.Sequential(*list(blocks)[first:last]))
    return out
