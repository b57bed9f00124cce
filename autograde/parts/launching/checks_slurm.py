"""The check of notebook 16 (SLURM): a learner's mapping from SLURM's variables to PyTorch's.

Both run under a real SLURM (autograde/cluster/slurm.py `available`: the system's where
sbatch has one, else the course's cluster of 2 emulated nodes n1 and n2, brought up for the check
where it is not running). Where there can be none (not root, SLURM not installed), they are not
applicable here, never failed.

`slurm_env` judges `torch_env_from_slurm(environ)` of exercises/slurm_env.py twice. First the
function is called (autograde/inprocess/runner.py `calls`, in a process of its own, never in
the checker's) for every task of made-up jobs whose node lists SLURM writes compressed and not
contiguous (`n[01-03,07]`), SLURM's own `scontrol` on PATH, and what it returns is compared with
what init_process_group's env:// needs. Then the file runs as the tasks of real batch jobs, for
several layouts: each task runs the file as `__main__` through
autograde/parts/launching/inprocess.py (`slurm-task FILE --out DIR`), which writes down the
task's SLURM variables and the PyTorch variables it joins with (`DIR/slurm-<task>.json`, the
run's report), and the trace shows the group it formed.

`slurm_job` submits the learner's batch script (exercises/slurm_job.sbatch): as it is (the layout
it asks for must be JOB_LAYOUT), with the layouts of JOB_LAYOUTS given on sbatch's command line,
and once more with one task failing at its start. $TRAIN_SCRIPT is the checker's probe
(autograde/parts/launching/inprocess.py `slurm_probe`), which writes down each task's variables
(`DIR/slurm-<task>.json`, DIR its trace folder) and joins a gloo group with env://.
Like the other checks, it reads behaviour, never names or wording.
"""
from __future__ import annotations

import functools
import shlex
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from autograde.cluster import slurm as slurm_cluster
from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.verdicts import NotHere, function_calls, require, run_ok
from autograde.engine.workspace import RunKind, Workspace, task_command
from autograde.parts.launching.reports import TORCH_VARIABLES, SlurmProbeTask, SlurmTask
from autograde.protocol import Call, CallsTask, read_reports
from autograde.settings import SLURM_FAIL

# The kinds of run these checks read (an item's `runs`, items.py)
SLURM_ENV_RUNS = RunKind("slurm_env")
SLURM_JOB_RUNS = RunKind("slurm_job")


FUNCTION = "torch_env_from_slurm"

# Made-up jobs: (job id, node list as SLURM writes it, its hosts, tasks per node). Real clusters'
# names: zero-padded ranges with a gap, a bare name first, dashes in names, two brackets in one
# name. The hosts are what `scontrol show hostnames` prints (tests/parts/launching/test_slurm_env.py asks
# SLURM's). The ids 4242-4244 are consecutive: jobs submitted one after the other must not share a port.
JOBS: tuple[tuple[int, str, tuple[str, ...], int], ...] = (
    (4242, "n[01-03,07]", ("n01", "n02", "n03", "n07"), 2),
    (4243, "gpu[9-11]", ("gpu9", "gpu10", "gpu11"), 1),
    (4244, "login2,a100-[07-08]", ("login2", "a100-07", "a100-08"), 3),
    (987654, "r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2"), 1),
)
# Real batch jobs: nodes x tasks per node (the course's cluster has 2 nodes).
LAYOUTS = ((1, 1), (1, 3), (2, 1), (2, 2))


@contextmanager
def _slurm(ws: Workspace) -> Iterator[dict[str, str]]:
    """The environment in which the check's jobs reach a SLURM (nothing to reach when replaying)."""
    if ws.replaying:
        yield {}
        return
    try:
        with slurm_cluster.available() as env:
            yield env
    except slurm_cluster.ClusterError as err:
        raise NotHere(f"this check submits jobs to SLURM, and there is none here ({err}); on a cluster, "
                      "run it on a login node") from None


def task_environ(job_id: int, nodelist: str, hosts: tuple[str, ...], per_node: int, task: int) -> dict[str, str]:
    """The SLURM variables that srun gives task `task` of a job with `per_node` tasks on each node
    of `nodelist` (tasks placed node by node, as SLURM's block distribution does)."""
    nodes, ntasks = len(hosts), len(hosts) * per_node
    node = task // per_node
    layout = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": "ddp",
            "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
            "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": layout,
            "SLURM_STEP_TASKS_PER_NODE": layout, "SLURM_CPUS_PER_TASK": "1",
            "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task % per_node), "SLURM_NODEID": str(node),
            "SLURMD_NODENAME": hosts[node], "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
            "SLURM_SUBMIT_HOST": hosts[0], "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.1"}


def _job_tasks(job_id: int, nodelist: str, hosts: tuple[str, ...], per_node: int) -> list[dict[str, str]]:
    return [task_environ(job_id, nodelist, hosts, per_node, t) for t in range(len(hosts) * per_node)]


def _describe(nodelist: str, hosts: tuple[str, ...], per_node: int) -> str:
    nodes = len(hosts)
    return f"{nodes} node{'s' if nodes > 1 else ''} {nodelist} x {per_node} task{'s' if per_node > 1 else ''}"


def _calls_run(ws: Workspace, env: dict[str, str]) -> Run:
    calls = [[FUNCTION, [task]] for job in JOBS for task in _job_tasks(*job)]
    return ws.called(SLURM_ENV_RUNS, "calls", f"calls of {FUNCTION} for the tasks of {len(JOBS)} made-up jobs",
                     CallsTask(script=str(ws.script), calls=calls), env)


def _returned(call: Call, where: str) -> dict[str, str]:
    """What one call returned, as PyTorch's variables (failing where it is not a dict of strings)."""
    require(call.error is None, f"{FUNCTION} raised {call.error} for {where}",
            "compute the variables from `environ`, the dict it is given (the checker calls it with made-up "
            "tasks, outside any job)")
    value = call.value
    require(isinstance(value, dict), f"{FUNCTION} returned {value!r} for {where}, not a dict",
            f"return a dict with the six variables ({', '.join(TORCH_VARIABLES)})")
    assert isinstance(value, dict)
    missing = [k for k in TORCH_VARIABLES if k not in value]
    require(not missing, f"{FUNCTION} returned no {', '.join(missing)} for {where}",
            f"return all six variables ({', '.join(TORCH_VARIABLES)})")
    wrong = {k: value[k] for k in TORCH_VARIABLES if not isinstance(value[k], str)}
    require(not wrong, f"{FUNCTION} returned {wrong} for {where}: os.environ takes only strings",
            "every value must be a string, as environment variables are")
    return {k: value[k] for k in TORCH_VARIABLES}


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() and 1024 <= int(text) <= 65535 else None


def judge_job(found: list[dict[str, str]], tasks: list[dict[str, str]], what: str) -> int:
    """Fail unless `found` (each task's PyTorch variables) is right for the job whose tasks'
    SLURM variables are `tasks`; the job's port."""
    n, per_node = len(tasks), int(tasks[0]["SLURM_NTASKS_PER_NODE"])
    first = next(t["SLURMD_NODENAME"] for t in tasks if t["SLURM_NODEID"] == "0")  # the job's first node
    ranks = [f["RANK"] for f in found]
    require(sorted(ranks) == sorted(map(str, range(n))),
            f"in {what}, the tasks got the ranks {', '.join(ranks)}; each of 0 to {n - 1} must be given to one task",
            "the rank is the task's place in the whole job: unique over all the nodes, not only on its node")
    sizes = sorted({f["WORLD_SIZE"] for f in found})
    require(sizes == [str(n)], f"in {what}, the tasks got the world size {' and '.join(sizes)}, not {n}",
            "the world size is the number of tasks in the whole job")
    for node in sorted({t["SLURM_NODEID"] for t in tasks}, key=int):
        mine = [f for f, t in zip(found, tasks) if t["SLURM_NODEID"] == node]
        name = tasks[[t["SLURM_NODEID"] for t in tasks].index(node)]["SLURMD_NODENAME"]
        local = [f["LOCAL_RANK"] for f in mine]
        require(sorted(local) == sorted(map(str, range(per_node))),
                f"in {what}, the tasks of node {name} got the local ranks {', '.join(local)}; each of 0 to "
                f"{per_node - 1} must be given to one of them",
                "the local rank is the task's place among the tasks of its own node")
        local_sizes = sorted({f["LOCAL_WORLD_SIZE"] for f in mine})
        require(local_sizes == [str(per_node)],
                f"in {what}, the tasks of node {name} got the local world size {' and '.join(local_sizes)}, "
                f"not {per_node}", "the local world size is the number of tasks on the task's node")
    addresses = sorted({f["MASTER_ADDR"] for f in found})
    require(addresses == [first],
            f"in {what}, the tasks got the address{'es' if len(addresses) > 1 else ''} "
            f"{', '.join(map(repr, addresses))}, not the job's first node {first!r}"
            + (" (the node list as SLURM writes it is not a host name)"
               if tasks[0]["SLURM_JOB_NODELIST"] in addresses else "")
            + (": every task must be told the same one" if len(addresses) > 1 else ""),
            "every task must get the same MASTER_ADDR: the first host of SLURM_JOB_NODELIST once expanded "
            "(`scontrol show hostnames` expands it)")
    zero = [t for f, t in zip(found, tasks) if f["RANK"] == "0"][0]
    require(zero["SLURMD_NODENAME"] == first,
            f"in {what}, rank 0 went to a task of node {zero['SLURMD_NODENAME']}, but MASTER_ADDR is {first}",
            "rank 0 hosts the rendezvous at MASTER_ADDR: it must be a task of the first node")
    ports = sorted({f["MASTER_PORT"] for f in found})
    require(len(ports) == 1, f"in {what}, the tasks got different ports: {', '.join(ports)}",
            "every task of a job must get the same MASTER_PORT")
    port = _port(ports[0])
    require(port is not None, f"in {what}, the port was {ports[0]!r}, not a whole number from 1024 to 65535",
            "MASTER_PORT must be a port an ordinary user may listen on: 1024 to 65535")
    assert port is not None
    return port


def _job(ws: Workspace, kind: RunKind, which: str, label: str, argv: list[str], batch: str, env: dict[str, str]) -> Run:
    """A run that submits `batch` with sbatch's options `argv` and ends with the job; the batch
    script is given `--out DIR`, the run's folder, where each task writes its report."""
    return ws.once(kind, which, label, lambda folder: [[processes.PYTHON, "-m", slurm_cluster.__name__, "job", *argv, batch,
                                                        "--out", str(folder)]],
                   argv, env, read=lambda folder: {"ranks": read_reports(folder)})


def _task_run(ws: Workspace, env: dict[str, str], nodes: int, per_node: int) -> Run:
    """The learner's file as the tasks of a batch job of `nodes` x `per_node`."""
    batch = ws.root / "slurm_env_check.sbatch"
    if not ws.replaying and not batch.exists():
        batch.write_text("#!/bin/bash\n# the checker's job: each task runs the learner's file, noted by the checker\n"
                         f"srun --kill-on-bad-exit=1 {shlex.join(task_command(SlurmTask(script=str(ws.script)), Path())[:-2])} "
                         "\"$@\"\n")  # "$@": --out DIR, the run's report folder (in place of the command's own)
    argv = ["--nodes", str(nodes), "--ntasks-per-node", str(per_node)]
    return _job(ws, SLURM_ENV_RUNS, f"{nodes}x{per_node}", f"job of {nodes} node{'s' if nodes > 1 else ''} x {per_node} "
                f"task{'s' if per_node > 1 else ''}", argv, str(batch), env)


def check_slurm_env(ws: Workspace) -> str:
    """torch_env_from_slurm(environ), called for every task of 4 made-up jobs (node lists such as
    n[01-03,07] and r[1-2]n[1-2]; 1 to 3 tasks per node; job ids 4242, 4243, 4244 and 987654),
    returns strings for RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT such that in each job the ranks are 0..N-1 once each, the local ranks 0..k-1 once
    each on every node, the sizes are the job's and the node's numbers of tasks, every task has
    the first host of the expanded node list as its address (and rank 0 runs there), every task
    the same port, from 1024 to 65535, and no two of the jobs the same port. Then the file runs
    as the tasks of batch jobs of 1x1, 1x3, 2x1 and 2x2 nodes x tasks: every task joins one gloo
    group with those variables, at its rank, and makes the all_reduce."""
    with _slurm(ws) as env:
        return _judge_slurm_env(ws, env)


def _judge_slurm_env(ws: Workspace, env: dict[str, str]) -> str:
    run = _calls_run(ws, env)
    calls = iter(function_calls(run))
    ports: dict[int, int] = {}
    for job_id, nodelist, hosts, per_node in JOBS:
        tasks = _job_tasks(job_id, nodelist, hosts, per_node)
        what = f"job {job_id} ({_describe(nodelist, hosts, per_node)})"
        found = [_returned(next(calls), f"task {t['SLURM_PROCID']} of {what}") for t in tasks]
        ports[job_id] = judge_job(found, tasks, what)
    shared = [(a, b) for a in ports for b in ports if a < b and ports[a] == ports[b]]
    require(not shared, f"jobs {shared[0][0] if shared else ''} and {shared[0][1] if shared else ''} both got the "
            f"port {ports[shared[0][0]] if shared else ''}: two jobs that share a node would both want it",
            "the port must depend on the job, so that jobs with different ids get different ports")
    for nodes, per_node in LAYOUTS:
        _judge_task_run(_task_run(ws, env, nodes, per_node), nodes, per_node)
    return (f"right variables for all {sum(len(j[2]) * j[3] for j in JOBS)} tasks of "
            f"{len(JOBS)} made-up jobs (ports {', '.join(str(p) for p in ports.values())}); in batch jobs of "
            f"{', '.join(f'{n}x{k}' for n, k in LAYOUTS)} nodes x tasks, each formed its group")


def _judge_task_run(run: Run, nodes: int, per_node: int,
                    runs: str = "the file must run as every task of a job (python exercises/slurm_env.py --nodes 2 "
                                "--ntasks-per-node 2, with SLURM up, shows what happens)",
                    seen: tuple[str, str] = ("called init_process_group", "each task must join the process group"),
                    ) -> None:
    """Fail unless every task of the run had the right variables (from the reports), and joined
    the group with them and made the all_reduce (from the traces). `runs`: the hint where the run
    failed; `seen`: what the reports show of a task, and the hint where some are missing."""
    n = nodes * per_node
    joins: list[dict[str, str]] = sorted((run.report or {}).get("ranks", []),  # one per task that reported
                                         key=lambda e: int(e["SLURM_PROCID"]))
    tasks = [{k: str(e[k]) for k in e if k.startswith("SLURM")} for e in joins]
    found = [{k: str(e.get(k)) for k in TORCH_VARIABLES} for e in joins]
    if len(joins) == n:  # wrong variables first: they are why such a run fails (an address that is no host's)
        judge_job(found, tasks, f"the {run.name}")
    run_ok(run, runs)
    require(len(joins) == n, f"in the {run.name}, {len(joins)} of {n} tasks {seen[0]}", seen[1])
    joined = {t.rank: t for t in run.traces.values() if t.rank is not None}
    require(sorted(joined) == list(range(n)), f"in the {run.name}, the ranks that joined were {sorted(joined)}",
            "each task must join the group with the variables the function returned (init_process_group's env://)")
    sizes = {e.get("world_size") for t in joined.values() if (e := t.joined()) is not None}
    require(sizes == {n}, f"in the {run.name}, the group had {sizes} processes, not {n}",
            "each task must join the group with the variables the function returned")
    reduced = [r for r, t in joined.items() if any(e.get("call") == "all_reduce" for e in t.named("exit"))]
    require(len(reduced) == n, f"in the {run.name}, {len(reduced)} of {n} ranks finished the all_reduce",
            "every task must make the all_reduce that proves the group")


# --- slurm_job: the learner's batch script ----------------------------------------------------

JOB_LAYOUT = (2, 2)  # nodes x tasks per node that exercises/slurm_job.sbatch must ask for
JOB_LAYOUTS = ((1, 3), (2, 1))  # given on sbatch's command line: the script must follow them
# $TRAIN_SCRIPT of the checker's jobs (written into the workspace): each task writes down its
# variables in its trace folder, then joins a gloo group with env:// and makes one all_reduce.


def _probe(ws: Workspace) -> Path:
    """The checker's $TRAIN_SCRIPT, written into the workspace once (before any job is submitted)."""
    probe = ws.root / "slurm_job_probe.py"
    if not ws.replaying and not probe.exists():
        command = task_command(SlurmProbeTask(), Path())
        probe.write_text(f"import runpy\nimport sys\n\nsys.argv = {command[2:]!r}\n"
                         f"runpy.run_module({command[2]!r}, run_name=\"__main__\")\n")
    return probe


def _job_run(ws: Workspace, slurm: dict[str, str], layout: tuple[int, int] | None, fail: bool = False) -> Run:
    """The learner's batch script submitted, its layout given on sbatch's command line (None: the
    one it asks for), $TRAIN_SCRIPT the checker's probe; with `fail`, its last task fails. The
    tasks' `python` is the course's: the checker puts its environment first on PATH."""
    probe = _probe(ws)
    argv = [] if layout is None else ["--nodes", str(layout[0]), "--ntasks-per-node", str(layout[1])]
    env = {**slurm, "TRAIN_SCRIPT": str(probe)}
    if layout is None:
        key, label = "asked", "job with the layout the script asks for"
    else:
        key, label = f"{layout[0]}x{layout[1]}", (f"job of {layout[0]} node{'s' if layout[0] > 1 else ''} x "
                                                   f"{layout[1]} task{'s' if layout[1] > 1 else ''} (given to sbatch)")
    if fail:
        key, label, env[SLURM_FAIL] = f"{key}-failing", f"{label}, its last task failing", "1"
    return _job(ws, SLURM_JOB_RUNS, key, label, argv, str(ws.script), env)


def _expanded_per_task(run: Run) -> None:
    """Fail where the job's tasks, each with SLURM variables of its own, were all given the same rank and
    local rank: the batch script's shell expanded $SLURM_PROCID and its siblings once, for itself, before
    srun started the tasks (the command srun runs in double quotes, say)."""
    reports = (run.report or {}).get("ranks", [])
    told = {(str(r.get("RANK")), str(r.get("LOCAL_RANK"))) for r in reports}
    procids = {str(r.get("SLURM_PROCID")) for r in reports}
    require(len(reports) < 2 or len(told) > 1 or len(procids) == 1,
            f"in the {run.name}, every one of the {len(reports)} tasks was told RANK={next(iter(told))[0]} and "
            f"LOCAL_RANK={next(iter(told))[1]}, though SLURM gave them SLURM_PROCID "
            f"{', '.join(sorted(procids, key=lambda p: int(p) if p.isdigit() else -1))}: the variables were "
            "expanded once, by the batch script's own shell, before srun started the tasks",
            "the command srun runs must reach each task unexpanded, so that each task's own shell expands "
            "$SLURM_PROCID and the others: in single quotes, not double quotes")


RUNS_TRAIN_SCRIPT = ("srun must start one task per process of the job, each running $TRAIN_SCRIPT "
                     "(with SLURM up, `sbatch --wait exercises/slurm_job.sbatch` shows what happens)")


def check_slurm_job(ws: Workspace) -> str:
    """The batch script submitted as it is asks for 2 nodes x 2 tasks (as many tasks ran, on as
    many nodes), and in that job and in jobs of 1x3 and 2x1 given to sbatch, every task runs
    $TRAIN_SCRIPT (the checker's probe) with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT right for the job (as slurm_env's check judges them), and they all
    join one gloo group and make the all_reduce. When the last task fails at its start, srun
    stops the others: the job ends rather than wait on them."""
    with _slurm(ws) as env:
        return _judge_slurm_job(ws, env)


def _judge_slurm_job(ws: Workspace, slurm: dict[str, str]) -> str:
    nodes, per_node = JOB_LAYOUT
    _probe(ws)
    ws.at_once(*(functools.partial(_job_run, ws, slurm, layout) for layout in (None, *JOB_LAYOUTS)),
               functools.partial(_job_run, ws, slurm, None, True))  # jobs of their own, side by side on the cluster
    asked = _job_run(ws, slurm, None)
    reports = (asked.report or {}).get("ranks", [])
    require(reports, f"no task of the {asked.name} ran $TRAIN_SCRIPT"
            + (f" ({asked.problem()})" if asked.problem() else ""), RUNS_TRAIN_SCRIPT)
    got = (len({r.get("SLURM_NODEID") for r in reports}), len(reports))
    require(got == (nodes, nodes * per_node),
            f"the {asked.name} ran {got[1]} task{'s' if got[1] > 1 else ''} on {got[0]} node"
            f"{'s' if got[0] > 1 else ''}, not {nodes * per_node} tasks on {nodes} nodes ({per_node} on each)",
            f"the script must ask SLURM for {nodes} nodes with {per_node} tasks on each, in its #SBATCH lines")
    seen = ("ran $TRAIN_SCRIPT", RUNS_TRAIN_SCRIPT)
    _expanded_per_task(asked)
    _judge_task_run(asked, nodes, per_node, RUNS_TRAIN_SCRIPT, seen)
    for layout in JOB_LAYOUTS:
        run = _job_run(ws, slurm, layout)
        _expanded_per_task(run)
        _judge_task_run(run, *layout, RUNS_TRAIN_SCRIPT, seen)
    failing = _job_run(ws, slurm, None, fail=True)
    last = nodes * per_node - 1
    require(not failing.stalled and not any(r.timed_out for r in failing.results),
            f"in the {failing.name}, task {last} exited at its start, and the other tasks went on waiting for it "
            f"(in init_process_group, until the checker stopped them): on a cluster they would hold the nodes "
            "until their own timeout",
            "srun lets the other tasks run on when one fails, unless it is told to stop them (--kill-on-bad-exit)")
    return (f"the script asks for {nodes} nodes x {per_node} tasks; in that job and in jobs of "
            f"{', '.join(f'{n}x{k}' for n, k in JOB_LAYOUTS)} given to sbatch, every task ran $TRAIN_SCRIPT with "
            f"the right variables and they formed their group; when task {last} failed, srun stopped the others "
            f"({failing.results[0].seconds:.0f} s)")
