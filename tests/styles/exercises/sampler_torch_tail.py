# replaces: ShardSampler
# All in torch: a generator seeded from seed and epoch together, padding taken from the end of
# the order rather than its start, and the shard picked with an index tensor.
class ShardSampler(Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        self.size = len(dataset)
        self.world = dist.get_world_size() if num_replicas is None else num_replicas
        self.rank = dist.get_rank() if rank is None else rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.size // self.world if self.drop_last else -(-self.size // self.world)

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(10_000 * self.seed + self.epoch)
        order = torch.randperm(self.size, generator=g) if self.shuffle else torch.arange(self.size)
        total = len(self) * self.world
        if total > self.size:
            order = torch.cat([order, order[self.size - (total - self.size):]])
        mine = order[torch.arange(self.rank, total, self.world)]
        return iter(mine.tolist())
