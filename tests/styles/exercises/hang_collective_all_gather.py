# replaces: report_mean_loss
def report_mean_loss(loss, epoch):
    """Rank 0 prints the mean over all ranks of their epoch losses (`loss`: this rank's)."""
    losses = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, loss)
    if dist.get_rank() != 0:
        return
    mean = torch.cat(losses).mean().item()
    print(f"epoch {epoch}: mean loss {mean:.6f} (ranks: {', '.join(f'{l.item():.4f}' for l in losses)})", flush=True)
