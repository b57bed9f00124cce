"""Train with DDP and survive a failure: a checkpoint every epoch, and a resume at every start.

torchrun starts the processes and, when one of them dies, stops the others and starts them
all again (up to --max-restarts times). A restart is a fresh start of this script, so
everything it knew is gone but what it saved: it must find the last checkpoint and go on from
the epoch after it, as if nothing had happened.

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 exercises/resume_training.py --epochs 5

The model is small (a two-layer CNN), so that a run takes seconds on a CPU.
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.datasets import FashionMNIST
from torchvision.transforms import ToTensor


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28x28 -> 14x14
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 14x14 -> 7x7
        return self.fc(x.flatten(1))


def save_checkpoint(path, model, optimizer, epoch):
    # TODO checkpoint: rank 0 saves the model's and the optimizer's state_dict, the epoch just
    # finished and every rank's RNG state (torch.get_rng_state(), gathered) in one dict.
    # Atomically: torch.save to a temporary file next to `path`, then os.replace() it onto `path`
    # (a rename is all or nothing, so a kill during the save leaves the previous checkpoint whole).
    # Then every rank waits at dist.barrier() until the checkpoint is complete.
    # Every rank's generator: each draws random numbers of its own (dropout, augmentation).
    mine = torch.get_rng_state().to(next(model.parameters()).device)  # NCCL gathers on the GPU
    rng_states = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rng_states, mine)
    if dist.get_rank() == 0:
        checkpoint = {
            "model": model.module.state_dict(),  # the model inside DDP: loads without DDP too
            "optimizer": optimizer.state_dict(),  # SGD's momentum buffers are part of the training
            "epoch": epoch,
            "rng": [state.cpu() for state in rng_states],  # by rank
        }
        temporary = f"{path}.tmp"
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
    dist.barrier()  # nobody goes on (or reads the file) before it is complete


def load_checkpoint(path, model, optimizer, device):
    """The epoch to start from: 1, or the one after the last checkpoint's."""
    # TODO resume: if `path` exists, torch.load it with map_location=device (it was saved from
    # rank 0's device), load the model's and the optimizer's state and this rank's RNG state, and
    # return the epoch after the saved one. Every rank loads it: each has its own copy of the model.
    if not os.path.exists(path):
        return 1
    checkpoint = torch.load(path, map_location=device)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    rank = dist.get_rank()
    if rank < len(checkpoint["rng"]):  # a rank new to the group (an elastic job grew) keeps its seed
        torch.set_rng_state(checkpoint["rng"][rank].cpu())
    return checkpoint["epoch"] + 1


def main():
    parser = argparse.ArgumentParser(description="DDP training that resumes from its last checkpoint.")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train in all, restarts included")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch and process")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate of SGD")
    parser.add_argument("--data-dir", default=os.environ.get("DDP_LAB_DATA_DIR", "./data"),
                        help="where Fashion-MNIST is, or goes")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="the checkpoint file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the other processes")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        parser.error("start me with torchrun, e.g. torchrun --standalone --nproc-per-node 2 --max-restarts 3 "
                     "exercises/resume_training.py")

    # torchrun says who we are; init_process_group reads RANK and WORLD_SIZE itself.
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()

    # One download per node, while the others wait.
    if local_rank == 0:
        train_set = FashionMNIST(args.data_dir, train=True, download=True, transform=ToTensor())
    dist.barrier()
    if local_rank != 0:
        train_set = FashionMNIST(args.data_dir, train=True, download=False, transform=ToTensor())
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(
        SmallCNN().to(device), device_ids=[local_rank] if torch.cuda.is_available() else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    start_epoch = load_checkpoint(args.checkpoint, model, optimizer, device)
    if rank == 0 and start_epoch > 1:
        print(f"resuming from {args.checkpoint} at epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)  # the same order as an uninterrupted run: it depends on the epoch only
        model.train()
        loss_sum, batches = torch.zeros((), device=device), 0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            batches += 1
        dist.all_reduce(loss_sum)
        save_checkpoint(args.checkpoint, model, optimizer, epoch)
        if rank == 0:  # after the save: from here on a kill loses nothing of this epoch
            print(f"epoch {epoch} | train loss {loss_sum.item() / (batches * dist.get_world_size()):.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
