# replaces: report_mean_loss
def report_mean_loss(loss, epoch):
    """Rank 0 prints the mean over all ranks of their epoch losses (`loss`: this rank's)."""
    total = loss.clone()
    dist.reduce(total, dst=0)  # only rank 0 needs the sum, but every rank takes part
    if dist.get_rank() == 0:
        mean = total.item() / dist.get_world_size()
        print(f"epoch {epoch}: mean loss over {dist.get_world_size()} ranks {mean:.6f}", flush=True)
