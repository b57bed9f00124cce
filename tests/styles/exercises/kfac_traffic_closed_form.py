# replaces: kfac_floats_per_step
import math


def factor_sizes(layers):
    """Each factor's number of rows: A over the inputs (plus the bias's constant input), G over the outputs."""
    return [n for fan_in, fan_out, bias in layers for n in (fan_in + int(bias), fan_out)]


def kfac_floats_per_step(layers, world_size, update_freq, steps):
    if world_size < 2:
        return 0
    sizes = factor_sizes(layers)
    refresh = 2 * sum(n ** 2 for n in sizes) + sum(sizes)  # all-reduced factors + broadcast (values, vectors)
    return math.ceil(steps / update_freq) * refresh / steps
