# replaces: kfac_floats_per_step
def kfac_floats_per_step(layers, world_size, update_freq, steps):
    """Walk the run step by step, as KFAC.step() would, adding up what each step hands to collectives."""
    sent = 0
    for step in range(steps):
        if world_size > 1 and step % update_freq == 0:
            for fan_in, fan_out, bias in layers:
                a_rows = fan_in + 1 if bias else fan_in
                for rows in (a_rows, fan_out):
                    sent += rows * rows          # the factor's all_reduce
                    sent += rows                 # eigenvalues
                    sent += rows * rows          # eigenvectors
    return sent / steps
