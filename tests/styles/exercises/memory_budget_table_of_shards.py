# replaces: bytes_per_rank
SHARDED_AT = {
    0: set(),
    1: {"optimizer_state"},
    2: {"optimizer_state", "gradients"},
    3: {"optimizer_state", "gradients", "parameters"},
}


def bytes_per_rank(model, batch_size, stage, world_size):
    whole = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    for p in model.parameters():
        b = p.nelement() * p.element_size()
        whole["parameters"] += b
        whole["gradients"] += b          # one gradient per parameter, same dtype
        whole["optimizer_state"] += 2 * b  # Adam: first and second moments

    elements = sum(p.nelement() for p in model.parameters())
    padded = math.ceil(elements / world_size) * world_size  # the flat vector, padded to split evenly
    result = {}
    for name, b in whole.items():
        result[name] = b * padded // elements // world_size if name in SHARDED_AT[stage] else b

    # walk the layers with a stand-in for each tensor: a Linear keeps its input, a ReLU its output
    kept = {}  # id of a tensor -> its bytes
    current = ("input", None)  # which tensor flows at this point
    width = itemsize = None
    for k, layer in enumerate(model.children()):
        if isinstance(layer, nn.Linear):
            itemsize = layer.weight.element_size()
            kept[current] = batch_size * layer.in_features * itemsize  # again for the same tensor: no change
            current, width = ("linear", k), layer.out_features
        elif isinstance(layer, nn.ReLU):
            current = ("relu", k)
            kept[current] = batch_size * width * itemsize  # its output, the next Linear's input
    result["activations"] = sum(kept.values())

    # the peak: at stage 3 one unit at a time is whole (its own shard kept apart as well)
    result["peak_parameters"] = whole["parameters"]
    if "parameters" in SHARDED_AT[stage]:
        units = [sum(p.nelement() * p.element_size() for p in m.parameters()) for m in model.children()
                 if isinstance(m, nn.Linear)]
        result["peak_parameters"] = result["parameters"] + max(units)
    return result
