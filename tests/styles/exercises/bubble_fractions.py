# replaces: bubble_fraction
import fractions


def bubble_fraction(stages, micro_batches, chunks=1):
    # the fill and drain cost (S - 1) passes of a whole stage, and a chunk's pass is 1/chunks of one
    idle = fractions.Fraction(stages - 1, chunks)
    busy = fractions.Fraction(micro_batches)
    return float(idle / (idle + busy))
