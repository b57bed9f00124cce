# replaces: ShardSampler
# numpy's RandomState for the permutation, np.resize for the padding, a strided slice, and a
# sampler that is not a torch Sampler at all (anything with __iter__ and __len__ will do).
import numpy as np


class ShardSampler:
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        self.length_of_data = len(dataset)
        self.num_replicas = num_replicas or dist.get_world_size()
        self.rank = dist.get_rank() if rank is None else rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        whole, rest = divmod(self.length_of_data, self.num_replicas)
        return whole if self.drop_last or rest == 0 else whole + 1

    def __iter__(self):
        if self.shuffle:
            order = np.random.RandomState(self.seed + self.epoch).permutation(self.length_of_data)
        else:
            order = np.arange(self.length_of_data)
        order = np.resize(order, len(self) * self.num_replicas)  # repeats from the start, or cuts
        return iter(order[self.rank::self.num_replicas].tolist())
