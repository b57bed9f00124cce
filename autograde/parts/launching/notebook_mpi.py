"""What notebook 16's section "MPI-style: mpirun" calls: the launcher demos/mpi/mpirun_fashion_mnist.sh
run for real under Debian's Open MPI (installed where missing: autograde/cluster/open_mpi.py), on this
machine or on emulated hosts; what each process was told, as a table and as a figure; and what the
env:// rendezvous asks of the environment. Every launch goes through runtime.run: a time limit, the
output in the cell, and nothing left running afterwards."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from autograde.cluster import open_mpi
from autograde.engine import processes
from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish

LAUNCHER = open_mpi.LAUNCHER
MAPPING = (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"),
           ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"))

# Stands in for the training script: joins the group as the lab's script does (env://), then prints,
# on one line, every OMPI_COMM_WORLD_* variable mpirun set, the names the launcher made of them, and
# what the group says.
SHOW = """\
import datetime, json, os
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
seen = {k: v for k, v in sorted(os.environ.items()) if k.startswith("OMPI_COMM_WORLD_")}
seen.update({k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")})
seen.update(host=os.environ.get("%s", "127.0.0.1"), group_rank=dist.get_rank(), group_size=dist.get_world_size())
# beside this file, one file per process: lines that several hosts' processes print at once can
# reach mpirun's output run together
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"seen-{dist.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
dist.barrier()
dist.destroy_process_group()
""" % open_mpi.HOST_VARIABLE


def ready() -> bool:
    """Whether `mpirun` is here (installed now where it can be); if not, say why and what to run."""
    why = open_mpi.install()
    if why is not None:
        print(f"Open MPI is not available here, so this cell runs nothing: {why}")
    return why is None


def mpirun(*args: str | int, np: int | None = None, hosts: int = 1,
           train_script: str = "exercises/fashion_mnist_torchrun.py", timeout: float | None = None) -> str:
    """`NP=np bash demos/mpi/mpirun_fashion_mnist.sh ARGS` from the course's folder, training
    `train_script` (by default 2 processes, fewer on a machine with 1 GPU or 1 core); with hosts > 1,
    on that many emulated hosts of np / hosts processes each (a hostfile, and a stand-in for ssh).
    Its output, in the cell; "" where Open MPI is missing."""
    if not ready():
        return ""
    np = np if np is not None else min(2, runtime.machine().max_processes)
    return _launch([*map(str, args)], np, hosts, runtime.course_file(train_script).resolve(), train_script, timeout)


def _launch(args: list[str], np: int, hosts: int, train_script: Path, shown_script: str, timeout: float | None,
            echo: bool = True) -> str:
    launcher = runtime.course_file(LAUNCHER).resolve()
    folder = launcher.parents[len(Path(LAUNCHER).parts) - 1]  # the course's folder, where a learner runs it
    env = {"NP": str(np), "TRAIN_SCRIPT": str(train_script)}
    shown = f"NP={np} "
    if hosts > 1:
        if np % hosts:
            raise ValueError(f"{np} processes do not split evenly over {hosts} hosts")
        env.update(open_mpi.emulated_hosts(Path(tempfile.mkdtemp(prefix="ddp-lab-mpi-")), hosts, np // hosts))
        shown += "HOSTFILE=hosts.txt "
        print("hosts.txt:\n" + Path(env["HOSTFILE"]).read_text().rstrip())
    print(f"$ {shown}TRAIN_SCRIPT={shown_script} bash {LAUNCHER} {' '.join(args)}".rstrip())
    return runtime.run(["bash", launcher, *args], env=env, cwd=folder, echo=echo,
                       timeout=timeout if timeout is not None else (300 if runtime.QUICK else None))


def variables(np: int = 4, hosts: int = 2) -> list[dict[str, object]]:
    """Run the launcher with a program that only joins the group and reports what it was told: one
    row per process (its OMPI_COMM_WORLD_* variables, the names they became, its host, and its rank
    and size in the group it joined), printed as a table; [] where Open MPI is missing."""
    if not ready():
        return []
    program = Path(tempfile.mkdtemp(prefix="ddp-lab-mpi-")) / "show_variables.py"
    program.write_text(SHOW)
    _launch([], np, hosts, program, program.name, timeout=120, echo=False)
    rows: list[dict[str, object]] = [json.loads(seen.read_text()) for seen in program.parent.glob("seen-*.json")]
    rows.sort(key=lambda r: int(str(r["RANK"])))
    names = ["host", *[name for pair in MAPPING for name in pair], "MASTER_ADDR", "group_rank", "group_size"]
    print("process".ljust(28) + "".join(f"{k:>11}" for k in range(len(rows))))  # one column per process
    for name in names:
        print(name.ljust(28) + "".join(f"{str(row.get(name)):>11}" for row in rows))
    others = sorted({k for row in rows for k in row if k.startswith("OMPI_COMM_WORLD_")} - {m for m, _ in MAPPING})
    if others:
        print(f"(mpirun also set: {', '.join(others)})")
    return rows


def env_needs() -> dict[str, str]:
    """What the env:// rendezvous (init_process_group's default) says without one of RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT, with Open MPI's names in place of RANK and WORLD_SIZE, and with the
    four but no LOCAL_RANK nor LOCAL_WORLD_SIZE: asked here, in this process, for a group of one."""
    import torch.distributed as dist  # slow: only when asked

    full = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": str(processes.free_port())}
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    cases = {**{f"without {name}": {k: v for k, v in full.items() if k != name} for name in full},
             "OMPI_COMM_WORLD_RANK and _SIZE instead of RANK and WORLD_SIZE":
                 {**ompi, "MASTER_ADDR": "localhost", "MASTER_PORT": full["MASTER_PORT"]},
             "all four, without LOCAL_RANK and LOCAL_WORLD_SIZE": full}
    names = [*full, *ompi, "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
    saved = {name: os.environ.get(name) for name in names}
    said = {}
    try:
        for case, given in cases.items():
            for name in names:
                os.environ.pop(name, None)
            os.environ.update(given)
            try:
                store, rank, world_size = next(dist.rendezvous("env://"))
                said[case] = f"the rendezvous succeeds: rank {rank} of {world_size}"
                del store
            except ValueError as err:
                said[case] = str(err).strip().splitlines()[0].split(": ", 1)[-1]
            print(f"{case}: {said[case]}")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return said


def mpi_backend() -> bool:
    """Whether this PyTorch has its MPI backend, and if not, what init_process_group("mpi") says
    (it refuses before it reads the environment or starts anything)."""
    import torch.distributed as dist  # slow: only when asked

    available = dist.is_mpi_available()
    print(f"torch.distributed.is_mpi_available(): {available}")
    if not available:
        try:
            dist.init_process_group("mpi")
        except RuntimeError as err:
            print(f'init_process_group("mpi"): {str(err).strip()}')
    return available


# Figures -------------------------------------------------------------------------------------

def mapping_figure(rows: list[dict[str, object]]) -> Figure:
    """The processes of one launch as `variables` reported them: one box per host, one per process
    inside it, each with the Open MPI variables it got and the PyTorch names the launcher made of them;
    rank 0's box says where the others met it (MASTER_ADDR:MASTER_PORT)."""
    if not rows:  # no Open MPI here: nothing ran
        fig, ax = plt.subplots(figsize=(4.5, 1.0))
        ax.text(0.5, 0.5, "no run: Open MPI is not installed here", ha="center", va="center")
        ax.axis("off")
        return finish(fig)
    hosts = list(dict.fromkeys(str(r["host"]) for r in rows))
    per_host = max(sum(str(r["host"]) == h for r in rows) for h in hosts)
    fig, ax = plt.subplots(figsize=(max(4.8, 4.6 * len(hosts)), 1.3 + 1.15 * per_host))
    width, pad = 4.0, 0.3
    for k, host in enumerate(hosts):
        x = k * (width + pad)
        ax.add_patch(FancyBboxPatch((x, 0), width, per_host * 1.1 + 0.6, boxstyle="round,pad=0.05",
                                    facecolor="#f2f2f2", edgecolor="#555555", linewidth=1.5))
        ax.text(x + width / 2, per_host * 1.1 + 0.3, f"host {host}" + (" (mpirun runs here)" if k == 0 else ""),
                ha="center", va="center", fontsize=10, fontweight="bold")
        on_host = sorted((r for r in rows if str(r["host"]) == host), key=lambda r: int(str(r["RANK"])))
        for j, row in enumerate(on_host):
            rank = int(str(row["RANK"]))
            y = (per_host - 1 - j) * 1.1 + 0.1
            ax.add_patch(Rectangle((x + 0.12, y), width - 0.24, 0.95, facecolor=RANK_COLOURS[rank % 10], alpha=0.3,
                                   edgecolor="#333333", gid=f"rank {rank}"))
            text = (f"OMPI_COMM_WORLD_RANK {row['OMPI_COMM_WORLD_RANK']} -> RANK {row['RANK']}\n"
                    f"OMPI_COMM_WORLD_LOCAL_RANK {row['OMPI_COMM_WORLD_LOCAL_RANK']} -> LOCAL_RANK {row['LOCAL_RANK']}")
            if rank == 0:
                text += f"\nlistens at MASTER_ADDR:MASTER_PORT = {row['MASTER_ADDR']}:{row['MASTER_PORT']}"
            ax.text(x + width / 2, y + 0.47, text, ha="center", va="center", fontsize=8, family="monospace")
    ompi_size, size = rows[0].get("OMPI_COMM_WORLD_SIZE"), rows[0]["WORLD_SIZE"]
    ax.set_xlim(-0.2, len(hosts) * (width + pad))
    ax.set_ylim(-0.2, per_host * 1.1 + 0.8)
    ax.axis("off")
    ax.set_title(f"mpirun -np {len(rows)}: OMPI_COMM_WORLD_SIZE {ompi_size} -> WORLD_SIZE {size} in every process",
                 fontsize=10)
    fig.tight_layout()
    return finish(fig)
