# replaces: PREDICTIONS
PREDICTIONS = dict(
    broadcast=((3.0, 30.0),) * 4,
    all_reduce=[(10.0, 100.0)] * 4,
    all_reduce_max=[[4.0, 40.0], [4.0, 40.0], [4.0, 40.0], [4.0, 40.0]],
    all_gather=[[[1, 10], [2, 20], [3, 30], [4, 40]]] * 4,  # out as a list of four buffers, not joined
    scatter=[(100, 101), (102, 103), (104, 105), (106, 107)],
    reduce_scatter=[(10.0, 20.0), (30.0, 40.0), (50.0, 60.0), (70.0, 80.0)],
)
