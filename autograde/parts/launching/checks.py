"""The checks of the part "launching for real": the learner's scripts started by torchrun, the
way a cluster starts them, and failed the way a cluster fails.

torchrun's check starts the learner's converted lab script with `torchrun --standalone
--nproc-per-node 2`, then as two node commands started together (`--nnodes 2 --node-rank 0|1`),
and judges which processes joined which group, and how they got there.

The checkpoint check starts the learner's resume_training.py under torchrun three times: once
undisturbed (each save slowed down by a second, so that a rank that does not wait for it is
caught going on), once with rank 1 killed (SIGKILL) in the middle of epoch 2, and once with
rank 0 killed halfway through writing its second checkpoint. torchrun restarts the group after
a kill; the check reads where the restarted processes began (from their optimizer steps) and
compares their final weights with the undisturbed run's. The faults are injected by the tracer
(autograde/parts/launching/inprocess.py), at steps and saves, never at times: a loaded machine only slows
them down. Like every check, they read behaviour, never names or wording.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autograde.engine import processes
from autograde.engine.run import Run
from autograde.engine.verdicts import Failed, require, run_ok
from autograde.engine.workspace import RunKind, Workspace
from autograde.protocol import COLLECTIVES, Event, ProcessTrace
from autograde.settings import KILL_AT_STEP, SLOW_SAVE, TEAR_SAVE

# The kinds of run these checks read (an item's `runs`, items.py)
TORCHRUN_RUNS = RunKind("torchrun")
CHECKPOINT_RUNS = RunKind("checkpoint")
RESTART_RUNS = RunKind("restart")


# torchrun ---------------------------------------------------------------------------------

# The options of the lab's script that a converted one keeps (the layout's go: torchrun says it).
TORCHRUN_ARGV = ["--widen-factor", "1", "--batch-size", "16", "--epochs", "2", "--target-accuracy", "0",
                 "--patience", "2"]


def _standalone(ws: Workspace) -> Run:
    """One node with 2 processes: `torchrun --standalone --nproc-per-node 2`."""
    return ws.torchrun(TORCHRUN_RUNS, "standalone", "torchrun --standalone run", [
        (["--standalone", "--nproc-per-node", "2"], [*TORCHRUN_ARGV, "--data-dir", str(ws.root / "disk")])])


def _two_nodes(ws: Workspace) -> Run:
    """Two node commands of 1 process each, started together, each with a disk of its own."""
    port = processes.free_port()
    return ws.torchrun(TORCHRUN_RUNS, "two_nodes", "two-node torchrun run", [
        (["--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1", "--rdzv-endpoint", f"localhost:{port}"],
         [*TORCHRUN_ARGV, "--data-dir", str(ws.root / f"node{k}-disk")]) for k in (0, 1)])


TORCHRUN_WAYS: list[tuple[str, Callable[[Workspace], Run]]] = [
    ("torchrun --standalone --nproc-per-node 2", _standalone),
    ("two torchrun node commands (--nnodes 2 --node-rank 0|1 --nproc-per-node 1)", _two_nodes)]


def _joined(run: Run) -> list[tuple[ProcessTrace, Event]]:
    """Each process that joined a process group, with init_process_group's exit event, by rank."""
    joined = [(t, e) for t in run.traces.values() if (e := t.joined()) is not None]
    return sorted(joined, key=lambda te: (te[1].get("rank_joined") or 0, te[0].pid))


def check_torchrun(ws: Workspace) -> str:
    """Started by torchrun, on one node with 2 processes and as two node commands: no process
    calls mp.spawn (torchrun started them all), the processes join as ranks 0 and 1 of a group
    of 2, each with the rank torchrun gave it in RANK, and they train with DDP to the same
    weights."""
    seen = []
    for how, make in TORCHRUN_WAYS:  # the second is made only if the first is right
        run = make(ws)
        spawned = [e for t in run.traces.values() for e in t.named("spawn")]
        require(not spawned, f"under {how}, a process called mp.{spawned[0]['call'] if spawned else 'spawn'}"
                f"(nprocs={spawned[0]['nprocs'] if spawned else '?'}): each of torchrun's processes started more",
                "torchrun has started every process already: the script must start none of its own; each process "
                "trains as the one torchrun made it, which its environment says")
        by_hand = f"run it yourself: {' '.join(run.argv)} (in a terminal, from the course folder)"
        joined = _joined(run)
        ranks = [(e.get("rank_joined"), e.get("world_size")) for _, e in joined]
        if sorted(ranks) != [(0, 2), (1, 2)]:  # a group that never formed: the run's own failure says why
            run_ok(run, by_hand)
        require(sorted(ranks) == [(0, 2), (1, 2)], f"under {how}, the processes joined as "
                f"{', '.join(f'rank {r} of {w}' for r, w in ranks) or 'nothing'}, not as ranks 0 and 1 of 2",
                "take the rank from os.environ['RANK'] and the world size from os.environ['WORLD_SIZE'] "
                "(or give init_process_group neither: it reads them there)")
        for trace, e in joined:
            require(e.get("env_rank") == str(e.get("rank_joined")),
                    f"under {how}, a process that torchrun gave RANK={e.get('env_rank')} joined as rank {e.get('rank_joined')}",
                    "the global rank is RANK, not LOCAL_RANK or a node's number: take it from os.environ['RANK']")
        for trace, e in joined:  # each rank trains on its own shard, of a world of 2
            shards = {(x.get("num_replicas"), x.get("sampler_rank")) for x in trace.named("sampler")}
            require((2, e.get("rank_joined")) in shards, f"under {how}, rank {e.get('rank_joined')}'s samplers were "
                    f"given {', '.join(f'num_replicas={n}, rank={r}' for n, r in sorted(shards, key=str)) or 'nothing'}: "
                    "it did not train on a shard of its own", "the sampler's rank is the global rank and its "
                    "num_replicas the world size, both from the environment (RANK, WORLD_SIZE)")
        run_ok(run, by_hand)
        fingerprints = {e["sha1"] for t, _ in joined for e in t.named("parameters") if e.get("when") == "end"}
        trained = all(t.named("first_optimizer_step") and t.named("ddp") for t, _ in joined)
        require(trained and len(fingerprints) == 1, f"under {how}, the 2 processes "
                + ("ended with different weights" if trained else "did not both train a DDP model"),
                "wrap the model in DistributedDataParallel as in the lab, and leave the group with "
                "dist.destroy_process_group() at the end")
        seen.append(how)
    return (f"{seen[0]}, then {seen[1]}: the processes joined as ranks 0 and 1 of 2 with the ranks torchrun "
            "set in RANK, none called mp.spawn, and both trained with DDP to the same weights")


# checkpoint -------------------------------------------------------------------------------

EPOCHS = 3
SLOW_SECONDS = 1.0  # each save of the undisturbed run waits this long first: a rank that does not wait is seen going on
RESTARTS = 3  # torchrun's --max-restarts for the runs with a kill (a restart's first try can fail to connect)
# Each restart gets a store of its own. In torch 2.14 the workers of every restart share torchrun's
# rendezvous store by default, and find the addresses of the killed group's ranks in it: about half
# of the restarts' first tries here failed to connect (gloo's connectFullMesh), some only after
# minutes. With this opt-out, none did (notebook 15 says so to learners).
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
TOLERANCE = 1e-6  # largest relative difference between a resumed run's weights and an undisturbed run's (see check)


@dataclass(frozen=True)
class _Write:
    """Rank 0 (or another) completed writing the checkpoint file: when it started, when it was whole."""

    rank: int | None
    start: float
    done: float


def life_of(trace: ProcessTrace) -> int | None:
    joined = trace.joined()
    return None if joined is None else int(joined.get("life") or 0)


def writes(run: Run, checkpoint: str) -> list[_Write]:
    """Every completed write of `checkpoint`: a torch.save straight into it, or a file renamed onto it
    (the write then started at the torch.save of the renamed file)."""
    found = []
    for trace in run.traces.values():
        saves: dict[str, float] = {}  # path -> when its torch.save started
        for e in trace.events:
            if e["ev"] == "save_enter" and e.get("path"):
                saves[e["path"]] = e["t"]
            elif (e["ev"] == "save_exit" and e.get("path") == checkpoint) or \
                    (e["ev"] == "moved" and e.get("dst") == checkpoint):
                written = checkpoint if e["ev"] == "save_exit" else str(e.get("src"))
                found.append(_Write(trace.rank, saves[written] if written in saves else e["t"], e["t"]))
    return sorted(found, key=lambda w: w.done)


def _doing(event: Event | None) -> str:
    """What a process that went on did, in words."""
    if event is None:
        return ""
    if event["ev"] == "enter":
        return f"it entered dist.{event.get('call')}()"
    if event["ev"] in ("set_epoch", "sampler_iter", "loader_iter"):
        return "it started the next epoch"
    return "it finished training" if event["ev"] == "parameters" else f"it went on to {event['ev'].replace('_', ' ')}"


def _shared(run: Run, checkpoint: str) -> tuple[str, list[int]] | None:
    """A checkpoint file (or a temporary file of it) that more than one rank wrote, with those ranks."""
    by_path: dict[str, set[int]] = {}
    for trace in run.traces.values():
        for e in trace.events:
            path = e.get("path") if e["ev"] == "save_enter" else e.get("dst") if e["ev"] == "moved" else None
            if trace.rank is not None and path and path.startswith(checkpoint):
                by_path.setdefault(path, set()).add(trace.rank)
    shared = sorted((path, sorted(ranks)) for path, ranks in by_path.items() if len(ranks) > 1)
    return shared[0] if shared else None


def _went_on(trace: ProcessTrace, start: float, end: float) -> Event | None:
    """What the process did between `start` and `end` (while rank 0 saved) other than waiting in a
    collective or printing: the next epoch's sampler and loader, or leaving the group. A process
    that waits does nothing else; one that is only slow to reach its barrier does nothing either."""
    for e in trace.events:
        if not start < e["t"] < end:
            continue
        if e["ev"] not in ("enter", "exit", "print", "moved", "save_enter", "save_exit"):
            return e
        if e["ev"] == "enter" and e.get("call") not in COLLECTIVES:
            return e
    return None


def _final(run: Run) -> dict[int, Event]:
    """The parameters event at the end of each rank of the life that finished, by rank."""
    ends = {}
    for trace in sorted(run.traces.values(), key=lambda t: life_of(t) or 0):
        for e in trace.named("parameters"):
            if e.get("when") == "end" and trace.rank is not None:
                ends[trace.rank] = e  # a later life's replaces an earlier one's
    return ends


def _checkpoint_file(ws: Workspace, which: str) -> Path:
    """The checkpoint file of one of the runs ("whole", "killed", "torn"), in a folder of its own."""
    return ws.root / f"checkpoint-{which}-files" / "checkpoint.pt"


def checkpoint_run(ws: Workspace, which: str, env: dict[str, str], restarts: int) -> Run:
    file = _checkpoint_file(ws, which)
    file.parent.mkdir(exist_ok=True)
    argv = ["--epochs", str(EPOCHS), "--batch-size", "16", "--data-dir", str(ws.root / "disk"),
            "--checkpoint", str(file), "--timeout", "30"]
    options = ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts)]
    label = {"whole": "undisturbed torchrun run", "killed": "torchrun run with a worker killed",
             "torn": "torchrun run with a kill during a save"}[which]
    kind = CHECKPOINT_RUNS if which == "whole" else RESTART_RUNS  # what the items read
    return ws.torchrun(kind, which, label, [(options, argv)], {**FRESH_STORE, **env})


def _kill_step(per_epoch: float) -> int:
    """The optimizer step after which rank 1 is killed: the middle of epoch 2."""
    return int(per_epoch * 1.5) + 1


def killed_run(ws: Workspace, per_epoch: float) -> Run:
    """The run in which rank 1 is killed (SIGKILL) in the middle of epoch 2."""
    return checkpoint_run(ws, "killed", {KILL_AT_STEP: f"1:{_kill_step(per_epoch)}"}, restarts=RESTARTS)


def torn_run(ws: Workspace) -> Run:
    """The run in which rank 0 is killed halfway through writing its second checkpoint (its first
    torch.save once the first checkpoint is complete, whatever files a checkpoint takes)."""
    return checkpoint_run(ws, "torn", {TEAR_SAVE: f"0:2:{_checkpoint_file(ws, 'torn').absolute()}"}, restarts=RESTARTS)


def checkpoint_path(run: Run) -> str:
    return str(Path(run.argv[run.argv.index("--checkpoint") + 1]).resolve())


def _started_at(steps: int, per_epoch: float) -> float:
    """The epoch a life began at, from the optimizer steps it made to the end of training."""
    return EPOCHS - steps / per_epoch + 1


def _compare(run: Run, whole: dict[int, Event], what: str) -> str:
    """How the final weights of `run` compare with the undisturbed run's (fails beyond TOLERANCE)."""
    final = _final(run)
    require(0 in final and 0 in whole, f"{what}: the restarted processes did not reach "
            "dist.destroy_process_group()", "leave the group at the end of training")
    if final[0]["sha1"] == whole[0]["sha1"]:
        return "identical"
    ours, theirs = final[0]["norms"], whole[0]["norms"]
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours, theirs)), default=float("inf"))
    require(len(ours) == len(theirs) and worst <= TOLERANCE, f"{what}, the final weights differ from an undisturbed "
            f"run's (a weight tensor's norm by {worst:.1e} relative, more than {TOLERANCE:g})",
            "the checkpoint must hold everything the next epoch needs: the model's and the optimizer's "
            "state_dict (SGD's momentum) and the epoch; load them all on every rank")
    return f"within {worst:.0e}"


def _whole(ws: Workspace) -> Run:
    """The undisturbed run, each save slowed down by SLOW_SECONDS."""
    return checkpoint_run(ws, "whole", {SLOW_SAVE: str(SLOW_SECONDS)}, restarts=0)


def read_while_written(run: Run, checkpoint: str) -> str | None:
    """Which rank read the checkpoint while rank 0 was still writing it, and when, or None: a load
    that overlaps a write (begun before it, a load still reading when the write starts counts too:
    ranks leaving a barrier together reach their load and rank 0 its save within microseconds, in
    either order)."""
    for k, write in enumerate(writes(run, checkpoint), 1):
        for trace in run.traces.values():
            for start, end in _loads(trace, checkpoint):
                if start <= write.done and end >= write.start:
                    return (f"rank {trace.rank} read {Path(checkpoint).name} while rank 0 was still writing the "
                            f"checkpoint of epoch {k}")
    return None


def _loads(trace: ProcessTrace, checkpoint: str) -> list[tuple[float, float]]:
    """When each load of the checkpoint by this process began and ended (a load never ended: the end
    of the trace)."""
    loads, began = [], None
    for e in trace.events:
        if e["ev"] == "load_enter" and e.get("path") == checkpoint:
            began = e["t"]
        elif e["ev"] == "load_exit" and began is not None:
            loads.append((began, e["t"]))
            began = None
    if began is not None:
        loads.append((began, trace.events[-1]["t"]))
    return loads


TORN_READ_HINT = "nobody reads the checkpoint before rank 0 has finished: dist.barrier() after the save, before any load"


def undisturbed(ws: Workspace) -> tuple[Run, str, dict[int, Event], float]:
    """The undisturbed run, its checkpoint file, each rank's final weights and the optimizer steps per epoch."""
    whole = _whole(ws)
    torn = None if whole.ok else read_while_written(whole, checkpoint_path(whole))
    if torn:  # said in words: the crash itself is half a file to unpickle, or a peer's lost connection
        raise Failed(f"{torn}, so it read half a file and the run failed ({whole.problem()})", TORN_READ_HINT,
                     step="checkpoint")
    run_ok(whole, "run it yourself: torchrun --standalone --nproc-per-node 2 exercises/resume_training.py "
           "--epochs 3 (delete checkpoint.pt first)")
    ends = _final(whole)
    require(0 in ends, "the undisturbed run's rank 0 did not reach dist.destroy_process_group()",
            "leave the group at the end of training")
    return whole, checkpoint_path(whole), ends, ends[0]["steps"] / EPOCHS


def check_checkpoint(ws: Workspace) -> str:
    """Under torchrun with 2 processes and 3 epochs, undisturbed: rank 0 alone writes the checkpoint
    file, once per epoch, while the other rank does nothing but wait: no next epoch's sampler or
    loader, no leaving the group (each save is slowed down by a second, so that a rank that goes on
    is seen doing so); no rank reads the file while it is being written."""
    whole = _whole(ws)
    checkpoint = checkpoint_path(whole)
    name = Path(checkpoint).name
    shared = _shared(whole, checkpoint)  # judged before the run's outcome: the mistake often crashes it
    require(not shared, f"ranks {' and '.join(map(str, shared[1] if shared else []))} each wrote "
            f"{Path(shared[0] if shared else name).name}: two processes writing one file can interleave their bytes "
            "and leave it broken (or one renames it away from the other)", "save on rank 0 only (dist.get_rank() == 0)")
    undisturbed(ws)
    saved = writes(whole, checkpoint)
    require(saved, f"in {EPOCHS} epochs, no process wrote {name} (the --checkpoint file)",
            "save a checkpoint at the end of every epoch, on rank 0")
    writers = sorted({w.rank for w in saved}, key=lambda r: -1 if r is None else r)
    require(writers == [0], f"ranks {' and '.join(map(str, writers))} all wrote {name}: two processes writing one "
            "file can interleave their bytes and leave it broken", "save on rank 0 only (dist.get_rank() == 0)")
    require(len(saved) == EPOCHS, f"rank 0 wrote {name} {len(saved)} time(s) in {EPOCHS} epochs",
            "save once at the end of every epoch")
    torn = read_while_written(whole, checkpoint)
    require(torn is None, torn or "", TORN_READ_HINT)
    others = [t for t in whole.traces.values() if t.rank not in (None, 0)]
    for k, write in enumerate(saved, 1):
        for trace in others:
            went = _went_on(trace, write.start, write.done)
            require(went is None, f"while rank 0 was writing the checkpoint of epoch {k} (the checker made each "
                    f"save last {SLOW_SECONDS:g} s longer), rank {trace.rank} went on without waiting for it "
                    f"({_doing(went)}): a failure in that time loses the checkpoint, and a rank that reads it gets "
                    "half a file", "after the save, every rank waits at dist.barrier() until rank 0 is done")
    return (f"3 epochs under torchrun --standalone --nproc-per-node 2: rank 0 alone wrote {name}, once per epoch, "
            f"while rank 1 waited, doing nothing else (each save made {SLOW_SECONDS:g} s slower), and no rank "
            "read it while it was being written")


def check_resume(ws: Workspace) -> str:
    """Under torchrun --max-restarts 3 with 2 processes and 3 epochs: after rank 1 is killed (SIGKILL)
    in the middle of epoch 2, the restarted group goes on from the epoch after the last complete
    checkpoint and ends with the weights of an undisturbed run (to 1e-6 relative: the same state,
    data order and operations give the same numbers; a state not restored, such as SGD's momentum,
    moves them far more). After rank 0 is killed halfway through writing the second checkpoint,
    the first one is still whole and the restart goes on from it."""
    _, checkpoint, ends, per_epoch = undisturbed(ws)
    name = Path(checkpoint).name  # the same in every run (each has its own folder)
    kill_step = _kill_step(per_epoch)
    killed = killed_run(ws, per_epoch)
    kills = [e for t in killed.traces.values() for e in t.named("killed")]
    require(kills, "rank 1 was never killed: the run with a kill ended before rank 1's optimizer step "
            f"{kill_step}", "train every epoch in full, on every rank", inconclusive=True)
    run_ok(killed, "after rank 1 was killed (SIGKILL) in epoch 2, torchrun restarted the group, which failed: "
           "load the checkpoint at every start, on every rank")
    complete = [w for w in writes(killed, checkpoint_path(killed)) if w.done < kills[0]["t"]]
    resumed = _resumed(killed, per_epoch, "after rank 1 was killed in epoch 2", len(complete))
    same = _compare(killed, ends, "after rank 1 was killed in epoch 2 and the group restarted")
    loads = [e for t in killed.traces.values() if (life_of(t) or 0) > 0 for e in t.named("load_enter")]
    if ws.gpus >= 2:  # saved from rank 0's GPU: without map_location, every rank loads onto GPU 0
        blind = [e for e in loads if e.get("map_location") in (None, "None")]
        require(not blind, "the restarted ranks loaded the checkpoint without map_location: every rank's copy "
                "went to the GPU it was saved from (rank 0's)", "torch.load(path, map_location=device)")
        placed = "loaded with map_location"
    else:
        placed = "map_location not judged: only GPUs show where a checkpoint's tensors land"

    torn = torn_run(ws)
    tears = [e for t in torn.traces.values() for e in t.named("killed")]
    require(tears, f"rank 0 was never killed while saving: it made no torch.save call once {name} was first "
            "complete",
            "save a checkpoint at the end of every epoch, on rank 0", inconclusive=True)
    torn_name = Path(tears[0].get("path") or name).name if tears else name
    atomic = ("write the checkpoint atomically: torch.save to a temporary file, then os.replace() it onto the "
              "checkpoint (a rename is all or nothing)")
    if not torn.ok:
        failed_load = [t for t in torn.traces.values() if (life_of(t) or 0) > 0 and _load_failed(t)]
        raise Failed(f"rank 0 was killed halfway through writing {torn_name}, and "
                     + ("the restarted processes could not load the checkpoint it left" if failed_load
                        else "the restarted group failed"), atomic, step="checkpoint")
    _resumed(torn, per_epoch, f"after rank 0 was killed halfway through writing {torn_name}", 1,
             lost=f"the kill during the save destroyed the previous checkpoint: {atomic}")
    torn_same = _compare(torn, ends, "after rank 0 was killed while saving and the group restarted")
    return (f"killed (SIGKILL) in epoch 2, rank 1's group was restarted by torchrun and went on from epoch "
            f"{resumed}, after the last complete checkpoint, ending with weights {same} to an undisturbed run's; "
            f"with rank 0 killed halfway through its second save, the first checkpoint was still whole and the "
            f"restart went on from epoch 2 (weights {torn_same}); {placed}")


def _load_failed(trace: ProcessTrace) -> bool:
    """Whether a load of this process failed: it raised, or never returned (older recordings of a load
    that raised have no end)."""
    exits = trace.named("load_exit")
    return any(e.get("error") for e in exits) or len(trace.named("load_enter")) > len(exits)


def _resumed(run: Run, per_epoch: float, what: str, complete: int, lost: str | None = None) -> int:
    """The epoch the finished life began at, required to be the one after the last complete checkpoint."""
    final = _final(run)
    require(0 in final, f"{what}, the restarted processes did not reach dist.destroy_process_group()",
            "leave the group at the end of training")
    began = _started_at(final[0]["steps"], per_epoch)
    expected = complete + 1
    if abs(began - expected) < 0.5:
        return expected
    if abs(began - 1) < 0.5:
        raise Failed(f"{what}, the restarted group began again at epoch 1 (it trained all {EPOCHS} epochs anew), "
                     f"though the checkpoint of epoch {complete} was complete",
                     lost or "at every start, load the checkpoint if there is one and go on from the epoch after it",
                     step="checkpoint" if lost else None)
    raise Failed(f"{what}, the restarted group began at epoch {began:g}, but the last complete checkpoint was "
                 f"epoch {complete}'s", "go on from the epoch after the saved one (the saved epoch + 1), "
                 f"to train {EPOCHS} epochs in all")
