# replaces: report_mean_loss
def report_mean_loss(loss, epoch):
    """Rank 0 prints the mean over all ranks of their epoch losses (`loss`: this rank's)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(loss.item(), gathered, dst=0)  # every rank sends; rank 0 receives the list
    if rank == 0:
        print(f"epoch {epoch}: mean loss over the ranks {sum(gathered) / world_size:.6f}", flush=True)
