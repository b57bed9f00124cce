# replaces: MasterWeights, bf16_allreduce_hook
class MasterWeights:
    def __init__(self, model, optimizer_cls, **kwargs):
        self.pairs = {}
        for p in model.parameters():
            if p.requires_grad:
                self.pairs[p] = torch.empty(p.shape, dtype=torch.float32).copy_(p.detach()).requires_grad_(True)
        self.optimizer = optimizer_cls(list(self.pairs.values()), **kwargs)

    def step(self):
        for p, master in self.pairs.items():
            master.grad = p.grad.to(torch.float32) if p.grad is not None else None
            p.grad = None
        self.optimizer.step()
        for p, master in self.pairs.items():
            p.data.copy_(master.data)
            master.grad = None


def bf16_allreduce_hook(process_group, bucket):
    """Blocking: the all-reduce is done before the hook returns a future already set."""
    buffer = bucket.buffer()
    n = dist.get_world_size(process_group)
    sent = (buffer / n).to(torch.bfloat16)
    dist.all_reduce(sent, group=process_group)
    done = torch.futures.Future()
    done.set_result(sent.to(buffer.dtype))
    return done
