# replaces: run_checkpointed
def run_checkpointed(blocks, x, segments):
    from functools import partial

    def through(first, last, inputs):
        for k in range(first, last):
            inputs = blocks[k](inputs)
        return inputs

    size = -(-len(blocks) // segments)  # runs of the same length, the last shorter
    first = 0
    while first < len(blocks):
        last = min(first + size, len(blocks))
        x = checkpoint(partial(through, first, last), x, use_reentrant=True)
        first = last
    return x

