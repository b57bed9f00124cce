"""Notebook 18's claims about the input pipeline (the `input_pipeline` task), checked against the
installed torch and Python: how a DataLoader's workers get their indices and return batches, what
persistent workers keep, when PyTorch warns about the number of workers, why the exercise starts
its processes with fork, and why threads help a reader that waits."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import ROOT
from torch.utils.data import DataLoader, Dataset, DistributedSampler

pytestmark = pytest.mark.timeout(120)


class Numbered(Dataset):
    """Item i is (i, the process that read it)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, os.getpid()


def _batches(loader: DataLoader, sampler: DistributedSampler, epochs: int) -> list[list[list[int]]]:
    found = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        found.append([indices.tolist() for indices, _ in loader])
    return found


@pytest.mark.launch
def test_workers_give_the_batches_in_the_samplers_order() -> None:
    """Hint 2: "the sampler still runs in the rank's own process and hands each worker the indices of
    a whole batch, and the batches come back in the sampler's order": with 3 workers, the same
    batches as with none, epoch after epoch (in_order is True by default), read by other processes."""
    dataset = Numbered()
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=5)
    plain = _batches(DataLoader(dataset, batch_size=4, sampler=sampler), sampler, 2)
    workers = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=3, multiprocessing_context="fork")
    assert _batches(workers, sampler, 2) == plain
    assert plain[0] != plain[1]  # set_epoch gave a new order, and the workers followed it
    per_batch = [set(pids.tolist()) for _, pids in workers]
    assert all(len(readers) == 1 for readers in per_batch)  # each batch read whole by one worker
    readers = set().union(*per_batch)
    assert os.getpid() not in readers and len(readers) == 3  # by the workers, in turn, not by this process
    assert {int(pid) for _, pids in DataLoader(dataset, batch_size=4) for pid in pids} == {os.getpid()}  # no workers
    import inspect

    assert inspect.signature(DataLoader).parameters["in_order"].default is True


@pytest.mark.launch
def test_persistent_workers_stay_alive_from_one_epoch_to_the_next() -> None:
    """Hint 2: "persistent_workers=True keeps them alive from one epoch to the next instead of starting
    new ones": the same worker processes read epoch 2 as epoch 1; without it, new ones."""
    def readers(loader: DataLoader) -> set[int]:
        return {int(pid) for _, pids in loader for pid in pids}

    for persistent in (True, False):
        loader = DataLoader(Numbered(), batch_size=8, num_workers=2, persistent_workers=persistent,
                            multiprocessing_context="fork")
        first, second = readers(loader), readers(loader)
        assert (first == second) is persistent, (persistent, first, second)


@pytest.mark.launch
def test_torch_warns_when_there_are_more_workers_than_cores_it_can_use() -> None:
    """Hint 2: "PyTorch warns when num_workers is above the number of cores it can use": the
    suggestion is torch._utils.cpu_count(), the CPUs this process may run on (sched_getaffinity)."""
    from torch._utils import cpu_count

    cores = cpu_count()
    assert cores == len(os.sched_getaffinity(0))
    for workers, warned in ((cores, False), (cores + 1, True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            iterator = iter(DataLoader(Numbered(), batch_size=8, num_workers=workers, multiprocessing_context="fork"))
            next(iterator)
            del iterator
        said = [str(w.message) for w in caught if "suggested max number of worker" in str(w.message)]
        assert bool(said) is warned, (workers, said)


def _start_method(rank: int, out: str) -> None:
    Path(out, f"{rank}").write_text(str(multiprocessing.get_start_method()))


@pytest.mark.launch
@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_processes_started_by_spawn_start_their_loaders_workers_by_spawn_too(how: str, tmp_path: Path) -> None:
    """The exercise's comment: under mp.spawn a process's DataLoader workers "would start a fresh
    Python each" (the process's default start method is spawn), under start_processes with fork
    they are forked too."""
    if how == "spawn":
        mp.spawn(_start_method, args=(str(tmp_path),), nprocs=1)
    else:
        mp.start_processes(_start_method, args=(str(tmp_path),), nprocs=1, start_method="fork")
    assert (tmp_path / "0").read_text() == how


def test_sleeping_threads_overlap() -> None:
    """Hint 2: "time.sleep, like a real disk read, lets other threads run while it waits": 8 threads
    that each sleep 0.2 s are done in far less than 8 x 0.2 s."""
    started = time.perf_counter()
    threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.perf_counter() - started < 0.8


def test_reading_everything_one_at_a_time_costs_two_epochs_of_a_ranks_share() -> None:
    """Hint 1: "a rank reading all 512 images waits as long as for the 2 epochs of its 256": the
    exercise's defaults, and one wait per read of SlowDisk."""
    text = (ROOT / "exercises" / "input_pipeline.py").read_text()
    for default in ('"--world-size", type=positive_int, default=2', '"--images", type=positive_int, default=512',
                    '"--epochs", type=positive_int, default=2', '"--batch-size", type=positive_int, default=16'):
        assert default in text, default
    assert text.count("time.sleep(READ_SECONDS)") == 1 and "READ_SECONDS = 0.004" in text


def _step_time(rank: int, port: int, out: str) -> None:
    import datetime

    import torch.distributed as dist
    import torch.nn.functional as F
    from conftest import load_module

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    exercise = load_module(ROOT / "exercises" / "input_pipeline.py")
    model = torch.nn.parallel.DistributedDataParallel(exercise.make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = torch.rand(16, 1, 28, 28), torch.zeros(16, dtype=torch.long)
    times = []
    for _ in range(40):
        started = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    Path(out, str(rank)).write_text(str(sorted(times)[len(times) // 2]))
    dist.destroy_process_group()


@pytest.mark.launch
def test_a_training_step_is_far_shorter_than_reading_its_batch(tmp_path: Path) -> None:
    """The exercise and notebook 18: reading a batch of 16 takes 64 ms, "while a training step takes
    a millisecond or two" (DDP's all-reduce included, 2 gloo processes): the median step is below
    a quarter of a batch's reads even on a busy machine."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    mp.start_processes(_step_time, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    steps = [float((tmp_path / str(rank)).read_text()) for rank in (0, 1)]
    assert max(steps) < 16 * 0.004 / 4, steps
