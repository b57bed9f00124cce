# replaces: bubble_fraction
def bubble_fraction(stages, micro_batches, chunks=1, forward=1.0, backward=2.0):
    """Counted on a stage's time line: its own passes, then the gaps the fill and the drain leave."""
    per_micro_batch = forward + backward  # one micro-batch through all of this stage's chunks, both ways
    busy = micro_batches * per_micro_batch
    # while the pipeline fills, a stage waits for a chunk pass of every stage before it (forward), and
    # while it drains, for every stage after it (backward): S - 1 chunk passes of each kind in all
    gaps = (stages - 1) * (forward / chunks + backward / chunks)
    step = busy + gaps
    return gaps / step
