"""What the notebooks of the part "scaling" (scaling, notebooks 17-19) call: the scaling study
(runs that write JSON-lines logs, read back, never parsed from printed lines), the profiler and
the fixes of demos/speed_fixes.py side by side, and the large-batch runs. Every launch goes
through runtime.run (a time limit, nothing left running afterwards). And the part's figures: the
fitted time model (17), a step's time split and the fixes' speedups (18), the large-batch runs
and their learning-rate schedules (19)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from autograde import data
from autograde.engine.processes import gpu_count
from autograde.engine.workspace import Workspace
from autograde.jupyter import runtime
from autograde.jupyter.figures import RANK_COLOURS, finish, scaling_axes
from autograde.parts.scaling import checks, checks_timed
from autograde.parts.scaling import checks_batches as batches
from autograde.parts.scaling import checks_speed as speed

STUDY_SCRIPT = "exercises/large_batch_training.py"  # your copy: its TODOs only change --large-batch
FINISHED = "solutions/large_batch_training.py"
GLOBAL_BATCH = 96   # strong scaling on a CPU: divides by 1, 2, 3, 4 and 6 processes
BUSY_PER_GPU = 128  # strong scaling on GPUs: images per GPU and step with every GPU at work (12-32 leave a GPU idle)
PER_PROCESS = 32    # weak scaling
NEVER = 10_000      # --patience: with --target-accuracy 0, every epoch asked for runs (no early stop)


read_log = runtime.read_log  # notebook 17 reads a run's log with it


def on_gpus() -> bool:
    """Whether the study runs one process per GPU: it needs 3 GPUs or more (3 runs fit the model);
    otherwise it runs CPU processes, GPUs hidden."""
    return gpu_count() >= 3


CPU_DATA = (4096, 512)  # on a CPU: a stand-in small enough for 4 processes on few cores
# quick mode (a smoke test of the cells): 4 strong-scaling steps an epoch, 12 weak-scaling steps for one process
QUICK_STUDY_DATA = (384, 96)


def run_options() -> tuple[dict[str, object], dict[str, str] | None]:
    """Training options and environment for a study run: on GPUs the lab's defaults and data; on a
    CPU the narrow model on a small stand-in (60,000 images take minutes an epoch there), GPUs hidden."""
    if on_gpus():
        return {}, None
    size, name = (QUICK_STUDY_DATA, "ddp-lab-scaling-quick-data") if runtime.QUICK else (CPU_DATA, "ddp-lab-scaling-data")
    return {"widen_factor": 1, "data_dir": data.temp_stand_in(name, *size)}, {"CUDA_VISIBLE_DEVICES": ""}


def processes_to_try() -> list[int]:
    """1 .. N: one per GPU on a node with 3 or more; on a CPU 1 .. 4 (1 .. 3 in quick mode)."""
    if on_gpus():
        return list(range(1, gpu_count() + 1))
    return list(range(1, (3 if runtime.QUICK else 4) + 1))


def strong_batch() -> int:
    """The global batch of the strong-scaling study: on GPUs, BUSY_PER_GPU for each GPU, so that
    even with every GPU at work each one has enough images a step to be busy rather than waiting on
    kernel launches; on a CPU, GLOBAL_BATCH."""
    return BUSY_PER_GPU * gpu_count() if on_gpus() else GLOBAL_BATCH


def study(kind: str, processes: list[int] | None = None, script: str = STUDY_SCRIPT,
          folder: str | Path | None = None, epochs: int | None = None) -> dict[int, Path]:
    """One run per number of processes, each writing its log: `kind` "strong" keeps the global
    batch at strong_batch() (each of N processes takes 1/N of it), "weak" keeps PER_PROCESS
    per process. Returns {N: log file}."""
    if kind not in ("strong", "weak"):
        raise ValueError('kind is "strong" or "weak"')
    out = Path(folder or tempfile.mkdtemp(prefix=f"ddp-lab-{kind}-"))
    out.mkdir(parents=True, exist_ok=True)
    logs = {}
    total = strong_batch()
    if kind == "strong":
        print(f"strong scaling: a global batch of {total} images a step, cut among the processes"
              + (f" ({BUSY_PER_GPU} per GPU with all {gpu_count()} at work)" if on_gpus() else ""))
    for n in processes or processes_to_try():
        batch = total // n if kind == "strong" else PER_PROCESS
        logs[n] = out / f"{kind}-{n}.jsonl"
        logs[n].unlink(missing_ok=True)
        options, env = run_options()
        # quick mode: weak scaling's time per step from one epoch (strong scaling's fit leaves the first out)
        quick_epochs = 1 if kind == "weak" else 2
        args = runtime.training_args(epochs=epochs or (quick_epochs if runtime.QUICK else 3), target_accuracy=0,
                                     patience=NEVER, batch_size=batch, **options)
        print(f"--- {kind} scaling, {n} process(es), batch {batch} per process ---")
        runtime.torchrun(script, *args, "--log-file", str(logs[n]), nproc=n, env=env)
    return logs


def step_times(logs: dict[int, Path]) -> dict[int, float]:
    """Seconds per optimizer step, from the epochs after the first (weak scaling's yardstick: with
    the batch per process fixed, an ideal step takes as long with N processes as with one)."""
    found = {}
    for n, path in logs.items():
        records = read_log(path)
        if len(records) > 1:
            found[n] = sum(r["epoch_time"] for r in records[1:]) / (records[-1]["steps"] - records[0]["steps"])
        else:
            found[n] = records[0]["epoch_time"] / records[0]["steps"]
    return found


def fit(times: dict[int, float]) -> tuple[float, float, float]:
    """(t_par, t_seq, t_comm) of T(N) = t_par/N + t_seq + t_comm (N - 1), least squares: the
    checker's own fit, the one your fit_time_model is compared with."""
    return checks.time_model(times)


# Where the time goes -------------------------------------------------------------------------

SPEED_SCRIPT = "demos/speed_fixes.py"
# Each fix against its baseline (the options it adds), and whether a CPU run says anything about it.
FIXES: list[tuple[str, list[str], str]] = [
    ("baseline (DataLoader, no workers)", [], ""),
    ("2 loader workers, pinned, persistent", ["--workers", "2", "--pin-memory", "--persistent-workers"],
     "on a CPU the workers take cores from training: expect no gain"),
    ("data preloaded as tensors", ["--preload"], ""),
    ("DDP buckets of 1 MB", ["--bucket-cap-mb", "1"], "more, smaller all-reduces"),
    ("gradient_as_bucket_view", ["--grad-as-bucket-view"], "saves a copy of the gradients: tiny on a small model"),
    ("accumulate 4, all-reduce each", ["--accumulate", "4"], "4 micro-batches per optimizer step"),
    ("accumulate 4 with no_sync", ["--accumulate", "4", "--no-sync"], "one all-reduce per 4 micro-batches"),
    ("bf16 autocast + channels_last", ["--bf16", "--channels-last"], "GPUs only: tensor cores"),
]
GPU_ONLY = {"--bf16", "--channels-last"}


@dataclass(frozen=True)
class Timing:
    name: str
    step_time: float | None       # seconds, the slowest rank's median (None: not run here)
    images_per_sec: float | None
    all_reduces_per_step: float | None
    note: str


def timed(*options: str, nproc: int = 2, steps: int | None = None) -> dict[str, Any]:
    """One run of demos/speed_fixes.py under torchrun; its JSON result. One GPU per process
    where there are GPUs enough (the full model), else CPU processes (the narrow one), GPUs hidden."""
    steps = steps or (6 if runtime.QUICK else 20)
    on_gpu = gpu_count() >= nproc
    args = ["--data-dir", str(runtime.data_dir()[0]), "--widen-factor", "10" if on_gpu else "1",
            "--steps", str(steps), "--warmup-steps", "2" if runtime.QUICK else "5", *options]
    command = [*runtime.TORCHRUN, "--standalone", "--nproc-per-node", str(nproc),
               runtime.course_file(SPEED_SCRIPT), *args]
    env = {"KINETO_LOG_LEVEL": "5", **({} if on_gpu else {"CUDA_VISIBLE_DEVICES": ""})}
    text = runtime.run(command, timeout=300, echo=False, env=env)
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        raise runtime.LaunchError(f"speed_fixes.py printed no result:\n{text[-2000:]}")
    return json.loads(lines[-1])


def profile(nproc: int = 2, folder: str | Path | None = None) -> dict[str, Any]:
    """The split of a step into data, forward, backward (with DDP's all-reduces) and optimizer,
    from torch.profiler, and the trace files (one per rank: chrome://tracing or ui.perfetto.dev)."""
    out = Path(folder or tempfile.mkdtemp(prefix="ddp-lab-profile-"))
    return timed("--profile", str(out), nproc=nproc)


QUICK_FIXES = ("--preload",)  # besides the baseline, in quick mode (it shows the cells run: two runs do)


def fixes(nproc: int = 2, quick: bool = False) -> list[Timing]:
    """Every fix of FIXES timed in one sitting, one after the other, on this machine (`quick`: the
    baseline and the preloaded data)."""
    on_gpu = gpu_count() >= nproc
    found = []
    for k, (name, options, note) in enumerate(FIXES, 1):
        if set(options) & GPU_ONLY and not on_gpu:
            found.append(Timing(name, None, None, None, "n/a: needs GPUs"))
            continue
        if quick and options and options[0] not in QUICK_FIXES:
            found.append(Timing(name, None, None, None, "not run in quick mode"))
            continue
        # each run takes seconds to minutes: say what runs, and what it gave, so the cell is never silent
        print(f"[{k}/{len(FIXES)}] {name}: speed_fixes.py {' '.join(options) or '(no options)'} ...", flush=True)
        result = timed(*options, nproc=nproc)
        print(f"      {result['step_time'] * 1000:.1f} ms a step, {result['images_per_sec']:.1f} images/s", flush=True)
        found.append(Timing(name, result["step_time"], result["images_per_sec"], result["all_reduces_per_step"], note))
    return found


def show(timings: list[Timing]) -> None:
    """The fixes as a table, each against the baseline."""
    base = timings[0].images_per_sec or 1.0
    print(f"{'':40} {'step':>9} {'images/s':>9} {'vs base':>8} {'all-reduces/step':>17}  note")
    for t in timings:
        if t.step_time is None or t.images_per_sec is None or t.all_reduces_per_step is None:
            print(f"{t.name:40} {'':>9} {'':>9} {'':>8} {'':>17}  {t.note}")
            continue
        print(f"{t.name:40} {t.step_time * 1000:7.1f}ms {t.images_per_sec:9.1f} {t.images_per_sec / base:7.2f}x "
              f"{t.all_reduces_per_step:17.1f}  {t.note}")


# Large batches ------------------------------------------------------------------------------

# The stand-in and the budget of notebook 19's check (checks_batches.py), and the experiment's runs:
# the reference, then a global batch 4 times larger at rates 1, 2, 4, 8 and 16 times the reference's,
# each from the first step. Measured (seed 0, 4 epochs; accuracy after the last): 0.68 at 0.02, 0.91
# at 0.08, 0.78 at 0.16; at 0.32 it reached 0.75 after epoch 3 and fell back to 0.51.
REFERENCE = ("1 process, batch 16, lr 0.02", 1, 16, 0.02)
EXPERIMENT = [REFERENCE, *((f"2 x 32, lr {r:g}", 2, 32, r) for r in (0.02, 0.04, 0.08, 0.16, 0.32))]
QUICK_EXPERIMENT = [EXPERIMENT[0], EXPERIMENT[1], EXPERIMENT[3]]  # quick mode: the same rate, and scaled by 4


QUICK_LARGE_BATCH_DATA = (256, 64)  # quick mode: the runs only show that the cells run


def large_batch_data() -> Path:
    """The stand-in the check trains on, written once to a temporary folder (in quick mode a quarter of it)."""
    if runtime.QUICK:
        return data.temp_stand_in("ddp-lab-large-batch-quick-data", *QUICK_LARGE_BATCH_DATA, seed=batches.DATA_SEED)
    folder = Path(tempfile.gettempdir()) / "ddp-lab-large-batch-data"
    if not data.has_data(folder):
        data.write_synthetic(folder, batches.TRAIN_IMAGES, batches.VAL_IMAGES, seed=batches.DATA_SEED)
    return folder


def large_batch_runs(script: str = STUDY_SCRIPT, runs: Sequence[tuple[str, int, int, float]] | None = None,
                     epochs: int | None = None, options: Sequence[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """One log per run (name, processes, batch per process, constant rate) of `script` on the check's
    stand-in, --seed 0, for the check's budget of epochs (1 in quick mode); `options` go to every run.
    The runs: EXPERIMENT's (three of them in quick mode) unless `runs` says."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-large-batch-"))
    logs = {}
    for i, (name, n, batch, rate) in enumerate(runs or (QUICK_EXPERIMENT if runtime.QUICK else EXPERIMENT)):
        log = folder / f"run-{i}.jsonl"
        args = runtime.training_args(epochs=epochs or (1 if runtime.QUICK else batches.BUDGET), target_accuracy=0,
                                     patience=NEVER, batch_size=batch, base_lr=rate, widen_factor=1,
                                     data_dir=str(large_batch_data()))
        command = [*args, "--seed", "0", *options, "--log-file"]
        # a run made before in this kernel, of the same file unchanged with the same options, gives the same log
        made = (str(runtime.course_file(script).resolve()), runtime.course_file(script).read_bytes(), n, *command)
        if made in _MADE:
            print(f"--- {name}: made before in this notebook, its log kept ---")
            logs[name] = _MADE[made]
            continue
        print(f"--- {name} ---")
        runtime.torchrun(script, *command, str(log), nproc=n, env={"CUDA_VISIBLE_DEVICES": ""})
        logs[name] = _MADE[made] = read_log(log)
    return logs


_MADE: dict[tuple[Any, ...], list[dict[str, Any]]] = {}  # large_batch_runs' logs by what made them


def my_plan(script: str = STUDY_SCRIPT) -> dict[str, list[dict[str, Any]]]:
    """Your --large-batch plan as the check trains it (its batch and rates are yours), beside the
    reference run."""
    return {**large_batch_runs(script, [REFERENCE]),
            **large_batch_runs(script, [("your plan (--large-batch, 2 processes)", 2, 16, 0.02)],
                               options=["--large-batch"])}


def measure_here(script: str = STUDY_SCRIPT, pairs: int = 1, steps: int = 8) -> list[speed.Pair]:
    """The speedup check's measurement, made here whatever the machine (on a CPU the ratio means
    little; the check itself needs 2 GPUs): pairs of timed runs of 1 and 2 processes."""
    with Workspace(runtime.course_file(script), say=print) as ws:
        found = checks_timed.measure_speedup(ws, 2, pairs, 16, 1, 2, steps)
    for k, pair in enumerate(found):
        print(f"pair {k + 1}: 1 process {pair.one.rate:7.1f} images/s over {pair.one.steps} steps; 2 processes "
              f"{pair.many.rate:7.1f} images/s (slowest rank {pair.many.seconds:.2f} s): ratio {pair.ratio:.2f}")
    print(f"median ratio: {speed.median_ratio(found):.2f}")
    return found


# Figures -------------------------------------------------------------------------------------

def time_model(seconds: dict[int, float], params: Sequence[float], predict_at: int = 16,
               what: str = "epoch time") -> Figure:
    """Left: measured times against N with the fitted T(N) = t_par/N + t_seq + t_comm (N - 1),
    drawn on to N = predict_at, and the ideal T(1)/N. Right: speedup and efficiency, measured
    and as the model predicts them, against the ideal."""
    processes = sorted(seconds)
    t_par, t_seq, t_comm = params
    model = lambda n: t_par / n + t_seq + t_comm * (n - 1)  # noqa: E731
    ns = list(range(1, predict_at + 1))
    fig, (ax_time, ax_speedup) = plt.subplots(1, 2, figsize=(12, 3.8))
    ax_time.plot(processes, [seconds[n] for n in processes], "o", label=f"measured {what}")
    ax_time.plot(ns, [model(n) for n in ns], "-",
                 label=f"fit: {t_par:.2f}/N + {t_seq:.2f} + {t_comm:.3f}(N-1)")
    ax_time.plot(ns, [seconds[1] / n for n in ns], "--", color="grey", label="ideal: T(1) / N")
    ax_time.plot([predict_at], [model(predict_at)], "s", color="C3", label=f"predicted T({predict_at}) = "
                 f"{model(predict_at):.2f} s")
    scaling_axes(ax_time, ns[:: max(1, predict_at // 8)], "seconds")
    ax_time.set_ylim(bottom=0)
    ax_time.set_title(f"{what} against the number of processes")
    ax_time.legend(loc="best", fontsize=8)
    ax_speedup.plot(ns, ns, "--", color="grey", label="ideal speedup: N")
    ax_speedup.plot(processes, [seconds[1] / seconds[n] for n in processes], "o", color="C0",
                    label="measured speedup")
    ax_speedup.plot(ns, [model(1) / model(n) for n in ns], "-", color="C0", alpha=0.6, label="model's speedup")
    ax_efficiency = ax_speedup.twinx()
    ax_efficiency.plot(processes, [seconds[1] / seconds[n] / n for n in processes], "o", color="C1",
                       label="measured efficiency")
    ax_efficiency.plot(ns, [model(1) / model(n) / n for n in ns], "-", color="C1", alpha=0.6,
                       label="model's efficiency")
    ax_efficiency.set_ylim(0, 1.1)
    ax_efficiency.set_ylabel("efficiency S(N) / N", color="C1")
    scaling_axes(ax_speedup, ns[:: max(1, predict_at // 8)], "speedup S(N)")
    ax_speedup.set_ylim(bottom=0)
    ax_speedup.set_title("speedup and efficiency")
    lines = ax_speedup.get_legend_handles_labels()
    more = ax_efficiency.get_legend_handles_labels()
    ax_speedup.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    fig.tight_layout()
    return finish(fig)


def time_split(phases: dict[str, float], title: str = "one training step") -> Figure:
    """Where a step's time goes: one bar cut into the phases (seconds per step), and below it the
    all-reduce's own time, which runs inside (and, with DDP's buckets, under) the backward pass."""
    order = [p for p in phases if p != "all-reduce"]
    fig, ax = plt.subplots(figsize=(10, 2.8))
    left = 0.0
    for k, name in enumerate(order):
        width = phases[name] * 1000
        ax.barh(1, width, left=left, color=RANK_COLOURS[k], edgecolor="black", label=name)
        if width > 0.06 * sum(phases[p] * 1000 for p in order):
            ax.text(left + width / 2, 1, f"{width:.0f} ms", ha="center", va="center", fontsize=8)
        left += width
    if "all-reduce" in phases:
        backward = [k for k, p in enumerate(order) if p.startswith("backward")]
        end = sum(phases[p] for p in order[:backward[0] + 1]) * 1000 if backward else left
        ax.barh(0, phases["all-reduce"] * 1000, left=end - phases["all-reduce"] * 1000, color="white",
                edgecolor="black", hatch="///", label=f"all-reduce ({phases['all-reduce'] * 1000:.0f} ms, inside backward)")
    ax.set_yticks([0, 1], ["communication", "step"])
    ax.set_xlabel("milliseconds per step")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=5, fontsize=8)
    fig.tight_layout()
    return finish(fig)


def fix_speedups(names: list[str], rates: list[float | None], notes: list[str] | None = None) -> Figure:
    """Images per second of each setting against the first (the baseline); a setting not run
    (rate None) shows its note instead of a bar."""
    base = rates[0] or 1.0
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1))
    for k, (name, rate) in enumerate(zip(names, rates)):
        if rate is None:
            ax.text(0.02, k, notes[k] if notes else "not run", va="center", fontsize=8, color="grey")
            continue
        ax.barh(k, rate / base, color="C2" if rate >= base else "C3")
        ax.text(rate / base, k, f" {rate / base:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("images / second, relative to the baseline")
    fig.tight_layout()
    return finish(fig)


def large_batch(logs: dict[str, list[dict[str, Any]]]) -> Figure:
    """Validation accuracy of each run by epoch (left) and by optimizer step (right): a larger
    global batch takes fewer steps per epoch, so at the same epoch it has taken fewer steps."""
    fig, (ax_epoch, ax_step) = plt.subplots(1, 2, figsize=(12, 3.8))
    for name, records in logs.items():
        epochs = [r["epoch"] for r in records]
        ax_epoch.plot(epochs, [r["val_accuracy"] for r in records], "o-", label=name)
        ax_step.plot([r["steps"] for r in records], [r["val_accuracy"] for r in records], "o-", label=name)
    ax_epoch.set_xlabel("epoch")
    ax_step.set_xlabel("optimizer steps")
    for ax in (ax_epoch, ax_step):
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    ax_epoch.set_title("by epoch")
    ax_step.set_title("by step")
    ax_epoch.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return finish(fig)


def lr_schedules(rates: dict[str, list[float]], warmup_steps: int | None = None, epoch_steps: int | None = None) -> Figure:
    """Learning rate against optimizer step, one line per setting; the warm-up's end (or each
    epoch's) dotted."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, values in rates.items():
        ax.plot(range(len(values)), values, ".-", label=name)
    if warmup_steps is not None:
        ax.axvline(warmup_steps, linestyle=":", color="black", label=f"end of the warm-up (step {warmup_steps})")
    for k, step in enumerate(range(epoch_steps or 0, len(max(rates.values(), key=len)), epoch_steps or 1)):
        ax.axvline(step, linestyle=":", color="grey", label="end of an epoch" if k == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return finish(fig)


exercise = runtime.exercise  # what notebooks 17-19 call
