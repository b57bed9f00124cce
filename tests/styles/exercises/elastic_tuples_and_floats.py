# replaces: node_joins, node_lost
def node_joins(epochs, after_epoch):
    # tuples, a float epoch, and a note of my own: only the named keys are read
    return dict(world_sizes=(1, 2), restarts=(0, 0), resumes_at=float(after_epoch + 1), rank_of_b=1.0,
                note="A is stopped mid-epoch; that epoch's work is lost")


def node_lost(epochs, after_epoch):
    prediction = {}
    prediction["world_sizes"] = (2, 1)
    prediction["restarts"] = (0, 1)
    prediction["resumes_at"] = after_epoch + 1
    prediction["rank_of_a"] = 0
    prediction["epochs_left"] = epochs - after_epoch
    return prediction
