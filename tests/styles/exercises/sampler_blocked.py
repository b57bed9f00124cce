# replaces: ShardSampler
# Contiguous blocks instead of every N-th index, Python's random module seeded with seed + epoch,
# padding by wrapping round to the start, and the shard size worked out once in __init__.
import random


class ShardSampler(Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        self.n = len(dataset)
        self.replicas = num_replicas if num_replicas is not None else dist.get_world_size()
        self.me = rank if rank is not None else dist.get_rank()
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        self.per_rank = self.n // self.replicas if drop_last else (self.n + self.replicas - 1) // self.replicas

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        wanted = self.per_rank * self.replicas
        order = [order[i % self.n] for i in range(wanted)]  # wraps round when padding, cuts when dropping
        start = self.me * self.per_rank
        yield from order[start:start + self.per_rank]

    def __len__(self):
        return self.per_rank
