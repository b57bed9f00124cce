# replaces: MasterWeights
class MasterWeights:
    """Masters made from the model's parameters by name; the model refreshed from them with load_state_dict."""

    def __init__(self, model, optimizer_cls, **kwargs):
        self.model = model
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        found = dict(model.named_parameters())
        self.masters = {name: torch.nn.Parameter(found[name].detach().to(torch.float32)) for name in self.names}
        self.opt = optimizer_cls(self.masters.values(), **kwargs)

    def step(self):
        found = dict(self.model.named_parameters())
        for name in self.names:
            grad = found[name].grad
            self.masters[name].grad = None if grad is None else grad.to(torch.float32)
            found[name].grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        rounded = {name: m.detach().to(torch.bfloat16) for name, m in self.masters.items()}
        self.model.load_state_dict(rounded, strict=False)
