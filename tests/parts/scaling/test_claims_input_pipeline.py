"""Notebook 18's claims about the input pipeline (the `input_pipeline` task), checked against the
installed torch and Python: what the share costs and who waits for it, what the handed-out
pipeline asks it for, what the script's profile shows of that, how a DataLoader's workers get
their indices, what persistent workers keep, and why the exercise starts its processes with fork."""
from __future__ import annotations

import multiprocessing
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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
    """What the style input_pipeline_cached_dataset and the mistake input_pipeline_more_workers rest
    on: the sampler still runs in the rank's own process and hands each worker the indices of a
    whole batch, and the batches come back in the sampler's order: with 3 workers, the same batches
    as with none, epoch after epoch (in_order is True by default), read by other processes."""
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
    """The fixes' cell: "Persistent workers are not restarted every epoch": the same worker
    processes read epoch 2 as epoch 1; without persistent_workers, new ones."""
    def readers(loader: DataLoader) -> set[int]:
        return {int(pid) for _, pids in loader for pid in pids}

    for persistent in (True, False):
        loader = DataLoader(Numbered(), batch_size=8, num_workers=2, persistent_workers=persistent,
                            multiprocessing_context="fork")
        first, second = readers(loader), readers(loader)
        assert (first == second) is persistent, (persistent, first, second)


def _start_method(rank: int, out: str) -> None:
    Path(out, f"{rank}").write_text(str(multiprocessing.get_start_method()))


@pytest.mark.launch
@pytest.mark.parametrize("how", ["spawn", "fork"])
def test_processes_started_by_spawn_start_their_loaders_workers_by_spawn_too(how: str, tmp_path: Path) -> None:
    """The exercise's comment: under start_processes with fork "each process starts as a copy of
    this one, torch already imported"; under mp.spawn it would start a fresh Python (the start
    method it sees as its own is spawn)."""
    if how == "spawn":
        mp.spawn(_start_method, args=(str(tmp_path),), nprocs=1)
    else:
        mp.start_processes(_start_method, args=(str(tmp_path),), nprocs=1, start_method="fork")
    assert (tmp_path / "0").read_text() == how


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
    images, labels = torch.rand(20, 1, 28, 28), torch.zeros(20, dtype=torch.long)
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
    """The exercise and notebook 18: "a training step of this model, DDP's all-reduce included,
    takes a millisecond or two", far less than the handed-out pipeline's wait for a batch of 20
    (40 requests of 1.5 ms): the median step (2 gloo processes) is below a quarter of that even on
    a busy machine."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    mp.start_processes(_step_time, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    steps = [float((tmp_path / str(rank)).read_text()) for rank in (0, 1)]
    assert max(steps) < 40 * 0.0015 / 4, steps


def _exercise() -> Any:
    from conftest import load_module

    return load_module(ROOT / "exercises" / "input_pipeline.py")


def _read_from_threads(disk: Any, requests: int) -> None:
    threads = [threading.Thread(target=disk.read, args=(0, 4)) for _ in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _read_in_a_process(rank: int, disk: Any) -> None:
    _read_from_threads(disk, 4)


@pytest.mark.launch
def test_the_share_answers_one_request_at_a_time_for_every_thread_and_forked_process(tmp_path: Path) -> None:
    """SlowDisk's docstring and hint 2: every request waits REQUEST_SECONDS, one at a time, for
    every process and thread of the run (each waits its turn on the share's queue, a locked file):
    8 threads take at least 8 waits, and 2 forked processes of 4 threads each take at least 8 too,
    not the 1 or 2 of requests that overlap."""
    exercise = _exercise()
    queue = tmp_path / "queue"
    queue.touch()
    disk = exercise.SlowDisk(16, 5, str(queue))
    wait = exercise.REQUEST_SECONDS
    started = time.perf_counter()
    _read_from_threads(disk, 8)
    assert time.perf_counter() - started >= 8 * wait
    started = time.perf_counter()
    mp.start_processes(_read_in_a_process, args=(disk,), nprocs=2, start_method="fork")
    assert time.perf_counter() - started >= 8 * wait


def test_the_whole_file_is_about_400_kb_and_one_request_for_it_costs_a_few_milliseconds(tmp_path: Path) -> None:
    """Hint 2: "the file is about 400 KB: one request for all of it costs a few milliseconds", with
    the script's defaults (512 images, seed 5)."""
    exercise = _exercise()
    (tmp_path / "queue").touch()
    disk = exercise.SlowDisk(512, 5, str(tmp_path / "queue"))
    (size,) = struct.unpack("<I", disk.read(0, 4))
    end = struct.unpack("<I", disk.read(4 * (size + 1), 4 * (size + 2)))[0]
    assert size == 512 and 350_000 <= end <= 450_000, end
    cost = exercise.REQUEST_SECONDS + end / exercise.BYTES_PER_SECOND
    assert 0.001 < cost < 0.01
    started = time.perf_counter()
    assert len(disk.read(0, end)) == end
    assert time.perf_counter() - started >= cost


def test_the_handed_out_images_ask_for_the_header_before_every_record(tmp_path: Path) -> None:
    """Hint 2 and the trace's 40 requests a batch of 20: Images makes two requests an image, the
    same header each time, then the image's record; decoded, the record is the image as floats in
    [0, 1] (k / 255) and its label."""
    exercise = _exercise()
    (tmp_path / "queue").touch()
    disk = exercise.SlowDisk(64, 5, str(tmp_path / "queue"))
    images = exercise.Images(disk)
    asked: list[tuple[int, int]] = []
    read = disk.read
    disk.read = lambda start, stop: asked.append((start, stop)) or read(start, stop)
    for i in (3, 17, 3):
        image, label = images[i]
        assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and 0 <= label < 10
        assert torch.equal(image * 255, (image * 255).round())
    assert len(asked) == 6 and asked[0] == asked[2] == asked[4] == (4, 4 * 66)
    assert asked[1] == asked[5] != asked[3]


def test_an_epoch_of_a_rank_is_twelve_batches_of_20_then_one_of_16() -> None:
    """The contract and the check: with the defaults (512 images, 2 ranks, 20 a batch), a rank's
    epoch is 12 batches of 20 and a last one of 16, the batches the check expects."""
    from autograde.parts.scaling import checks_timed

    text = (ROOT / "exercises" / "input_pipeline.py").read_text()
    for default in ('"--world-size", type=positive_int, default=2', '"--images", type=positive_int, default=512',
                    '"--epochs", type=positive_int, default=2', '"--batch-size", type=positive_int, default=20'):
        assert default in text, default
    sampler = DistributedSampler(range(512), num_replicas=2, rank=1, shuffle=True, seed=5)
    sizes = [len(b) for b in DataLoader(range(512), batch_size=20, sampler=sampler)]
    assert sizes == [20] * 12 + [16] == checks_timed.PIPELINE_EPOCH


@pytest.mark.launch
def test_the_profile_shows_each_batchs_requests_and_the_wait_for_them(tmp_path: Path) -> None:
    """The notebook's profile of the handed-out pipeline (--profile: with_stack=True records
    Python's calls): 40 calls of SlowDisk.read a step, for a batch of 20, each split between the
    sleep of the request and the wait for its turn on the share's queue (flock), and most of a step waiting for the batch."""
    from autograde.parts.scaling import notebook_pipeline as pipeline

    launched = subprocess.run([sys.executable, str(ROOT / "exercises" / "input_pipeline.py"), "--slow", "--images", "240",
                               "--epochs", "1", "--profile", str(tmp_path)], capture_output=True, text=True, timeout=100)
    assert launched.returncode == 0, launched.stderr[-2000:]
    trace = pipeline.read_trace(tmp_path / "slow-rank0.json")
    assert trace.steps == 3
    reads, sleep, lock, wait = (trace.row(e) for e in ("): read", "function sleep>", "function flock>", pipeline.WAIT))
    assert reads and sleep and lock and wait, [r.name for r in trace.rows]
    assert reads.calls == sleep.calls == lock.calls == 40 * trace.steps
    assert wait.seconds > 0.8 * trace.seconds
    assert pipeline.check_reading(trace, 40, wait.seconds / trace.seconds)
    assert not pipeline.check_reading(trace, 20, wait.seconds / trace.seconds)


def test_a_file_that_is_no_profile_is_refused_in_a_line(tmp_path: Path) -> None:
    """The notebook's reading of a trace: a file that is not torch.profiler's JSON, or a trace
    with no profiled step, gives a one-line error that says which, never a traceback of json's."""
    from autograde.parts.scaling import notebook_pipeline as pipeline

    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "empty.json").write_text('{"traceEvents": [{"ph": "X", "name": "x", "dur": 1}]}')
    with pytest.raises(ValueError, match="is not a trace torch.profiler wrote"):
        pipeline.read_trace(tmp_path / "text.json")
    with pytest.raises(ValueError, match="holds no profiled step"):
        pipeline.read_trace(tmp_path / "empty.json")
