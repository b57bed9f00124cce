# replaces: ring_all_reduce
# Blocking send and recv only, in an order that cannot deadlock: even ranks send first, odd
# ranks receive first. Chunk boundaries computed by hand.
def ring_all_reduce(tensor, op="sum"):
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = [flat.numel() * i // n for i in range(n + 1)]
    piece = lambda i: flat[bounds[i % n]:bounds[i % n + 1]]

    def swap(out, into):
        if rank % 2 == 0:
            dist.send(out.clone(), (rank + 1) % n)
            dist.recv(into, (rank - 1) % n)
        else:
            dist.recv(into, (rank - 1) % n)
            dist.send(out.clone(), (rank + 1) % n)

    for step in range(n - 1):
        got = torch.zeros_like(piece(rank - step - 1))
        swap(piece(rank - step), got)
        if op == "max":
            piece(rank - step - 1).copy_(torch.max(piece(rank - step - 1), got))
        else:
            piece(rank - step - 1).add_(got)
    for step in range(n - 1):
        got = torch.zeros_like(piece(rank - step))
        swap(piece(rank + 1 - step), got)
        piece(rank - step).copy_(got)
    return tensor
