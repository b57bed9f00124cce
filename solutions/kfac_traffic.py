"""Predict what distributed K-FAC communicates: the floats one rank hands to collectives a step.

    python exercises/kfac_traffic.py        # your prediction for notebook 26's MLP

Notebook 26 then measures it: your K-FAC (exercises/kfac.py) runs on 2 processes, traced, and the
table shows your prediction beside what rank 0's trace counted.

The design is the one notebook 26 has you build (`# TODO kfac_distributed` in exercises/kfac.py):

- at a refresh, each layer's batch factors A and G are all-reduced, each as a whole matrix;
- then each factor's eigendecomposition, its eigenvalues and its eigenvectors, goes from the rank
  that owns the layer to every other rank, one broadcast each;
- at the steps between refreshes, K-FAC calls no collective at all.

DDP's all-reduce of the gradients is not K-FAC's: leave it out.
"""


def kfac_floats_per_step(layers, world_size, update_freq, steps):
    """The floats one rank hands to K-FAC's collectives, on average over a run of `steps` calls of
    KFAC.step() (counted from 0; the first one refreshes), on `world_size` processes.

    layers: the model's nn.Linear layers in order, as (in_features, out_features, has_bias).
    Every element of every tensor a rank passes to a collective counts once, whether the rank sends
    it or receives it. Returns a number (floats a step).
    """
    # TODO kfac_traffic: your prediction, for any layers, world size, update_freq and number of steps.
    if world_size == 1:  # no process group to talk to
        return 0.0
    refreshes = -(-steps // update_freq)  # steps 0, k, 2k, ... below `steps`: a ceiling
    per_refresh = 0
    for inputs, outputs, bias in layers:
        for n in (inputs + bias, outputs):  # A is over the inputs (and a 1 for the bias), G over the outputs
            per_refresh += n * n            # the factor, all-reduced
            per_refresh += n + n * n        # its eigenvalues and eigenvectors, broadcast
    return refreshes * per_refresh / steps


if __name__ == "__main__":
    mlp = [(784, 128, True), (128, 64, True), (64, 10, True)]  # exercises/kfac.py's make_model
    for k in (1, 10):
        print(f"update_freq {k:2}: {kfac_floats_per_step(mlp, 2, k, 48)} floats a step on 2 processes, 48 steps")
