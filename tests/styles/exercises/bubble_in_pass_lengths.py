# replaces: bubble_fraction
def bubble_fraction(stages, micro_batches, chunks=1):
    """In lengths of a chunk's forward and backward pass: a stage works chunks * M of them, and waits
    S - 1 of them while the pipeline fills and as many while it drains, forward and backward alike."""
    work = chunks * micro_batches
    waiting = stages - 1
    return waiting / (work + waiting)
