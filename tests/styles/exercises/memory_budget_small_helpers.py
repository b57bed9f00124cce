# replaces: bytes_per_rank
def _itemsize(dtype):
    import torch

    return torch.tensor([], dtype=dtype).element_size()


def _split(n, ways):
    return -(-n // ways)  # ceil without floats


def _numel(model):
    return sum(p.numel() for p in model.parameters())


def _activation_elements(model, batch_size):
    # what enters each Linear is saved for its weight's gradient; a ReLU's output is the very tensor
    # the next Linear takes in, so counting the Linears' inputs counts everything once
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return batch_size * sum(layer.weight.shape[1] for layer in linears)


def bytes_per_rank(model, batch_size, stage, world_size):
    import torch

    f32 = _itemsize(torch.float32)
    n = _numel(model)
    shard = _split(n, world_size)
    held = lambda first_sharded_stage: shard if stage >= first_sharded_stage else n
    biggest_unit = max(_numel(m) for m in model.modules() if isinstance(m, nn.Linear))
    return dict(
        parameters=f32 * held(3),
        gradients=f32 * held(2),
        optimizer_state=f32 * 2 * held(1),
        activations=f32 * _activation_elements(model, batch_size),
        # ZeRO-3 gathers one layer at a time next to the shards; below it everything is always there
        peak_parameters=f32 * (held(3) + biggest_unit if stage == 3 else n),
    )
