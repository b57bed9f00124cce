"""What notebook 15's section "Elastic: nodes that come and go" calls: torchrun with `--nnodes 1:2`
and the c10d rendezvous, two torchrun agents on this machine standing for two nodes (node A on
127.0.0.1, which hosts the rendezvous, node B on 127.0.0.2), running the course's checkpointing
program (exercises/ or solutions/resume_training.py) for real:

- `join_later`: A starts alone, B arrives once rank 0 has finished an epoch; torchrun stops A's
  worker and starts both nodes' workers again, in a group of 2, which go on from the checkpoint;
- `lose_node`: A and B start together; once rank 0 has finished an epoch, every process of B is
  killed (or frozen: SIGSTOP); A's torchrun starts its worker again, alone, from the checkpoint.

Each returns an ElasticRun: per life of the group (one rendezvous round), its world size, which
node held which rank, the epochs trained and when. `timeline` draws them. Every process goes
through autograde.engine.processes: a time limit, and nothing left running afterwards, whatever happens.
"""
from __future__ import annotations

import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from autograde import data
from autograde.engine import processes
from autograde.jupyter import runtime
from autograde.jupyter.figures import finish
from autograde.parts.launching.notebook_elastic_lives import NODES, ElasticRun, _pump, _Watch

# Chosen from torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (torch 2.14) and measured
# here (notebook 15 gives the numbers):
# - last_call_timeout (default 30 s): once the first node has joined (the minimum of 1 is reached),
#   how long the rendezvous waits for more before it starts the group. 3 s lets B, started together
#   with A, into the first group; it is also what the survivor waits after losing B;
# - keep_alive_interval x keep_alive_max_attempt (defaults 5 s x 3): a node without a heartbeat for
#   that long is dead, and only then does the rendezvous let the survivor go on alone. 1 s x 3;
# - join_timeout (default 600 s): a rendezvous that cannot complete gives up after 60 s, not 10 min.
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=60"
MAX_RESTARTS = 3  # failures only: torchrun does not count the restarts that admit a new node
TRAIN_IMAGES = 8192  # a stand-in of this size: an epoch takes a second or two on one CPU core
EPOCHS = 6
# Every agent: its INFO log (rendezvous results, restarts), a store of its own per restart (notebook
# 15's note on --max-restarts), CPU and gloo (the two "nodes" would otherwise share GPU 0), and the
# worker's output in whole lines (its prints flush; unbuffered, a line could split around a log line).
AGENT_ENV = {"LOGLEVEL": "INFO", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "CUDA_VISIBLE_DEVICES": "",
             "PYTHONUNBUFFERED": ""}


Action = Literal["join", "kill", "freeze"]


def join_later(script: str = "exercises/resume_training.py", *, epochs: int = EPOCHS, after_epoch: int = 1,
               port: int | None = None, timeout: float = 240, data_dir: str | Path | None = None,
               echo: bool = True) -> ElasticRun:
    """Node A starts alone (`--nnodes 1:2`: one node is enough) and trains; once rank 0 has
    finished epoch `after_epoch`, node B starts and joins. What happened."""
    return _scenario("a node joins", "join", script, epochs, after_epoch, port, timeout, data_dir, 30, echo)


def lose_node(script: str = "exercises/resume_training.py", *, epochs: int = EPOCHS, after_epoch: int = 2,
              how: Literal["kill", "freeze"] = "kill", collective_timeout: float = 30, port: int | None = None,
              timeout: float = 240, data_dir: str | Path | None = None, echo: bool = True) -> ElasticRun:
    """Nodes A and B start together; once rank 0 has finished epoch `after_epoch`, every process of
    node B is killed (SIGKILL: a node that dies) or frozen (SIGSTOP: a node that hangs, its
    connections still open). `collective_timeout` is the program's --timeout: how long a collective
    waits for a peer that does not answer. What happened."""
    if how not in ("kill", "freeze"):
        raise ValueError(f"how must be 'kill' or 'freeze', not {how!r}")
    return _scenario(f"a node is {'killed' if how == 'kill' else 'frozen'}", how, script, epochs, after_epoch, port,
                     timeout, data_dir, collective_timeout, echo)


def check(run: ElasticRun, world_sizes: list[int]) -> None:
    """What an elastic job promises, checked on `run`: the group had these sizes, life after life;
    every life after the first went on from the checkpoint; the last one trained the last epoch.
    One line for what held, or an AssertionError in one line for the first thing that did not."""
    if run.world_sizes != world_sizes:
        late = " (node B came after the job had finished: more epochs give it time)" if run.world_sizes == [1] else ""
        raise AssertionError(f"the group's sizes were {' -> '.join(map(str, run.world_sizes)) or 'none'}, "
                             f"not {' -> '.join(map(str, world_sizes))}{late}")
    found = []
    for before, life in zip(run.lives, run.lives[1:]):
        if life.resumed_at is None:
            raise AssertionError(f"life {life.number} began again at epoch 1: it found no checkpoint (finish "
                                 "save_checkpoint and load_checkpoint in exercises/resume_training.py first)")
        last = max(before.epochs, default=0)
        how = "the one after the last epoch finished" if life.resumed_at == last + 1 else \
            f"epoch {last} again: life {before.number} stopped during its save" if life.resumed_at == last else \
            f"though life {before.number} had finished epoch {last}"
        found.append(f"life {life.number} went on at epoch {life.resumed_at} ({how})")
    if not run.finished:
        raise AssertionError(f"the last life did not finish epoch {run.epochs}")
    print(f"OK: world sizes {' -> '.join(map(str, run.world_sizes))}; {'; '.join(found)}; "
          f"all {run.epochs} epochs trained, in {run.seconds:.0f} s")


def compare(prediction: object, run: ElasticRun) -> None:
    """A prediction (a dict, as exercises/elastic_predictions.py returns) beside what `run` did, key by key."""
    if not isinstance(prediction, dict):
        print(f"the prediction is {prediction!r}, not a dict")
        return
    last = run.lives[-1] if run.lives else None
    measured: dict[str, object] = {"world_sizes": run.world_sizes,
                                   "restarts": [life.restart_count for life in run.lives],
                                   "resumes_at": last.resumed_at if last else None}
    measured |= {f"rank_of_{node.lower()}": rank for node, rank in (last.ranks.items() if last else ())}
    for key, value in measured.items():
        if key in prediction or not key.startswith("rank_of_"):
            mine = prediction.get(key, "(not predicted)")
            print(f"{key:<12} predicted {str(mine):<16} measured {value}"
                  + ("   (the earliest it can be)" if key == "resumes_at" and len(run.lives) > 1
                     and run.world_sizes[0] < run.world_sizes[-1] else ""))


def stand_in(folder: str | Path | None = None) -> Path:
    """The small synthetic stand-in the scenarios train on (written on first use)."""
    if folder is None:
        return data.temp_stand_in(f"ddp-lab-elastic-data-{TRAIN_IMAGES}", TRAIN_IMAGES, 256)
    return data.choose(Path(folder), Path(folder), TRAIN_IMAGES, 256, seed=5)[0]


def torchrun_command(node: str, port: int, script: Path, args: list[str]) -> list[str]:
    """Node `node`'s torchrun command line (with this course's Python for `torchrun`)."""
    host = "1" if node == "A" else "0"  # the rendezvous store lives on A: the endpoint's node
    return [str(processes.PYTHON), "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{NODES['A']}:{port}", "--rdzv-id", f"ddp-lab-{port}",
            "--max-restarts", str(MAX_RESTARTS), "--local-addr", NODES[node],
            "--rdzv-conf", f"is_host={host},{RDZV_CONF}", str(script), *args]


def shown(command: list[str]) -> str:
    """A command line as a person would type it: `torchrun`, and paths relative to the course."""
    words = ["torchrun", *command[3:]] if command[1:3] == ["-m", "torch.distributed.run"] else command
    return " ".join(_relative(w) for w in words)


def _relative(word: str) -> str:
    try:
        return str(Path(word).relative_to(Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()))
    except ValueError:
        return word


def port_is_free(port: int) -> bool:
    """Whether a rendezvous could listen on `port` (nothing bound to it on any address)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _inputs(script: str, epochs: int, after_epoch: int, port: int | None, timeout: float,
            collective_timeout: float) -> tuple[Path, int]:
    """The script's path and the port, or ValueError/FileNotFoundError in one line."""
    if after_epoch < 1:
        raise ValueError(f"after_epoch must be at least 1 (a checkpoint to go on from), not {after_epoch}")
    if epochs < after_epoch + 2:
        raise ValueError(f"epochs must be at least after_epoch + 2 = {after_epoch + 2} (epochs left to train "
                         f"once the group has changed), not {epochs}")
    if timeout <= 0 or collective_timeout <= 0:
        raise ValueError("timeout and collective_timeout must be positive numbers of seconds")
    if port is None:
        port = processes.free_port()
    elif not 1024 <= port <= 65535:
        raise ValueError(f"port must be between 1024 and 65535, not {port}")
    elif not port_is_free(port):
        raise ValueError(f"port {port} is busy (something on this machine holds it): choose another, "
                         "or leave port=None for a free one")
    return runtime.course_file(script).resolve(), port


def _scenario(title: str, action: Action, script: str, epochs: int, after_epoch: int, port: int | None,
              timeout: float, data_dir: str | Path | None, collective_timeout: float, echo: bool) -> ElasticRun:
    path, port = _inputs(script, epochs, after_epoch, port, timeout, collective_timeout)
    root = stand_in(data_dir)
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-elastic-"))
    args = ["--epochs", str(epochs), "--data-dir", str(root), "--checkpoint", str(folder / "checkpoint.pt"),
            "--timeout", f"{collective_timeout:g}"]
    commands = {node: torchrun_command(node, port, path, args) for node in NODES}
    if echo:
        for node in NODES:
            print(f"node {node}$ {shown(commands[node])}")
    watch = _Watch(title, epochs, echo)
    lines: queue.Queue[tuple[float, str, str | None]] = queue.Queue()
    procs: dict[str, subprocess.Popen[str]] = {}
    started = time.monotonic()

    def launch(node: str) -> None:
        proc = processes.start(commands[node], cwd=folder, env=AGENT_ENV, merge_stderr=True)
        procs[node] = proc
        watch.event(time.monotonic() - started, node, "started")
        threading.Thread(target=_pump, args=(proc.stdout, node, lines, started), daemon=True).start()

    acted = False
    try:
        launch("A")
        if action != "join":
            launch("B")
        deadline = started + timeout
        awaited = set(NODES) if action == "join" else {"A"}  # the nodes whose end is the run's end
        open_streams = set(procs)  # B's, in a join, once B has started
        while awaited & open_streams:
            now = time.monotonic()
            if now >= deadline:
                last = watch.last_line()
                raise runtime.LaunchError(f"stopped after {timeout:g} s (the time limit): {last}")
            if all(n in procs and procs[n].poll() is not None for n in awaited) and now - started - watch.last_seen > 3:
                break  # those agents are gone; a stream still open belongs to a process about to be killed
            try:
                t, node, line = lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                open_streams.discard(node)
                continue
            watch.line(t, node, line)
            if not acted and watch.done_epoch(after_epoch):
                acted = True
                t = time.monotonic() - started
                if action == "join":
                    launch("B")
                    open_streams.add("B")
                elif action == "kill":
                    processes.kill_group(procs["B"].pid)
                    watch.event(t, "B", "killed")
                else:
                    processes.signal_launch(procs["B"].pid, signal.SIGSTOP)
                    watch.event(t, "B", "frozen")
        for node, proc in procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()) if node in awaited else 1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for proc in procs.values():  # SIGKILL ends a frozen (stopped) process too
            processes.kill_group(proc.pid)
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)  # the checkpoint: nothing reads it afterwards
    seconds = time.monotonic() - started
    status = {node: proc.returncode for node, proc in procs.items()}
    for node, code in status.items():
        if node == "B" and action != "join":
            continue  # killed or frozen on purpose
        if code != 0:
            raise runtime.LaunchError(f"node {node}'s torchrun failed (exit status {code}): "
                                      f"{watch.last_line(node)}")
    run = watch.result(commands, status, seconds, folder)
    if echo:
        if action == "join" and len(run.lives) < 2:
            print(f"(node B came after the job had finished: try more epochs than {epochs})")
        print(run.table())
    return run


# Figure ---------------------------------------------------------------------------------------

def timeline(*runs: ElasticRun) -> Figure:
    """Each run as a timeline, one row per node: a bar for each life of the group the node was in
    (its colour: the group's size), a tick where rank 0 finished an epoch (its number above), a dot
    where rank 0 loaded the checkpoint, and when a node started, was killed or frozen; in grey,
    the time a node had no worker: torchrun starting, then the rendezvous. A life's bar begins as
    the rendezvous completes, with the worker's own start (Python, torch, the data) before its
    first epoch."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 0.6 + 1.9 * len(runs)), squeeze=False)
    colours = {1: "tab:orange", 2: "tab:blue"}
    for ax, run in zip(axes[:, 0], runs):
        _draw(ax, run, colours)
    handles = [Patch(color=colours[1], alpha=0.55, label="in a group of 1"),
               Patch(color=colours[2], alpha=0.55, label="in a group of 2"),
               Patch(facecolor="lightgrey", hatch="///", edgecolor="white", label="torchrun starting, rendezvous"),
               Line2D([], [], color="black", linewidth=1.5, label="epoch done (rank 0)"),
               Line2D([], [], color="tab:green", marker=">", linestyle="", label="torchrun started"),
               Line2D([], [], color="tab:green", marker="o", linestyle="", label="checkpoint loaded (rank 0)"),
               Line2D([], [], color="red", marker="X", linestyle="", markersize=9, label="killed / frozen")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return finish(fig)


def _draw(ax: Axes, run: ElasticRun, colours: dict[int, str]) -> None:
    rows = {node: y for y, node in enumerate(NODES)}
    for node, y in rows.items():  # grey: torchrun starting, then in the rendezvous (no worker on the node)
        since = next((t for t, n, what in run.events if n == node and what == "started"), None)
        for life in (life for life in run.lives if node in life.ranks):
            if since is not None and life.start - since > 0.05:
                ax.barh(y, life.start - since, left=since, height=0.5, color="lightgrey", hatch="///",
                        edgecolor="white", linewidth=0)
                ax.text((since + life.start) / 2, y + 0.02, f"{life.start - since:.1f} s", fontsize=7,
                        ha="center", va="center")
            since = life.ends.get(node, life.end)
    for life in run.lives:
        for node, start in ((n, life.start) for n in life.ranks):
            y = rows[node]
            end = life.ends.get(node, life.end)
            ax.barh(y, end - start, left=start, height=0.5, color=colours.get(life.world_size, "tab:grey"), alpha=0.55)
            ax.text(start + 0.2, y + 0.02, f"life {life.number}: rank {life.ranks[node]} of {life.world_size}",
                    fontsize=7, va="center")
            for epoch, t in life.epochs.items():
                ax.plot([t, t], [y - 0.25, y + 0.25], color="black", linewidth=1.5)
                if life.ranks[node] == 0:  # rank 0's node: its epoch numbers
                    ax.text(t, y - 0.32, str(epoch), fontsize=7, ha="center", va="bottom")
        if life.resumed_at is not None and life.loaded_at is not None:
            y = rows[next(n for n, rank in life.ranks.items() if rank == 0)]
            ax.plot(life.loaded_at, y + 0.25, marker="o", color="tab:green", markersize=6)  # on the bar's lower edge
            ax.text(life.loaded_at, y + 0.33, f"checkpoint loaded: goes on at epoch {life.resumed_at}", fontsize=7,
                    color="tab:green", ha="center", va="top")
    for t, node, what in run.events:
        if what == "started":
            ax.plot(t, rows[node], marker=">", color="tab:green", markersize=9)
        elif what in ("killed", "frozen"):
            ax.plot(t, rows[node], marker="X", color="red", markersize=11)
            ax.text(t, rows[node] + 0.32, what, color="red", fontsize=7, ha="center", va="top")
    ax.set_yticks(list(rows.values()), [f"node {n}\n{NODES[n]}" for n in rows])
    ax.set_ylim(len(rows) - 0.4, -0.75)
    ax.set_xlim(-0.6, run.seconds * 1.01)
    ax.set_xlabel("seconds since the first torchrun started")
    ax.set_title(f"{run.title}: world sizes {' -> '.join(map(str, run.world_sizes))}, "
                 f"{run.seconds:.0f} s in all", fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
