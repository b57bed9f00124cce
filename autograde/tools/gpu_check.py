"""`make gpu-check`: prove the lab's GPU path on a machine with NVIDIA GPUs, and write a report.

CI has no GPU, so this is the only place where the NCCL path of the finished solution, the
checker on GPUs and the notebooks with quick mode off ever run. On the GPU node the course
will use, an instructor runs it once before the course. It:

1. trains the finished solution for 2 epochs of the full model (--widen-factor 10) on every GPU,
   and on one GPU, and reports images/sec, epoch time and the speedup;
2. trains 1 epoch with --sync-bn (the Optional step) on every GPU;
3. checks the finished solution, every step, and three catalogued mistakes that must fail;
4. runs notebooks 02, 06 and 09 under nbval with quick mode off (when nbval is installed);
5. writes a markdown report, and exits non-zero when anything failed.

Where something cannot run on this machine (the checker's GPU mode needs 2 GPUs) the report
says `n/a` and why. Without GPUs it says so in one line and exits 0.

    python -m autograde.tools.gpu_check [--report docs/gpu-report.md] [--data-dir DIR] [--parts training checks notebooks]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograde.checker import api, devices, output
from autograde import data, processes, paths
REPO, SOLUTION = paths.REPO, paths.SOLUTION
NOTEBOOKS = ["02_baseline.ipynb", "06_step_7_ddp.ipynb", "09_evaluation.ipynb"]
MISTAKES = ["rank_is_local_rank", "device_not_pinned", "no_set_epoch"]  # names in tests/mistakes.py
TRAIN_LIMIT = 1800.0
PARTS = ["training", "checks", "notebooks"]


@dataclass
class Report:
    """Lines of the markdown report, and whether anything failed."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)

    def row(self, what: str, verdict: str, detail: str) -> None:
        self.add(f"| {what} | {verdict} | {detail} |")
        if verdict == "FAIL":
            self.failures.append(what)


def _mistakes() -> tuple[dict[str, object], set[str]]:
    """The catalogue of typical mistakes, from the test suite (its one source), and the names of
    those that only the checker's GPU mode can show."""
    spec = importlib.util.spec_from_file_location("ddp_lab_mistakes", REPO / "tests" / "mistakes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return ({m.name: m for m in [*module.MISTAKES, *module.GPU_MISTAKES]}, {m.name for m in module.GPU_MISTAKES})


def train(gpus: int, data_dir: Path, epochs: int, *extra: str) -> tuple[list[output.Epoch], float, str]:
    """The finished solution on `gpus` GPUs: its epoch lines, wall time, and the output's tail on failure."""
    cmd = [processes.PYTHON, str(SOLUTION), "--num-gpus", str(gpus), "--widen-factor", "10", "--epochs", str(epochs),
           "--target-accuracy", "1.01", "--data-dir", str(data_dir), "--master-port", str(processes.free_port()), *extra]
    result = processes.run(cmd, timeout=TRAIN_LIMIT, env={"OMP_NUM_THREADS": "4"})
    problem = "" if result.returncode == 0 and not result.timed_out else (
        f"exit status {result.returncode}{' (time limit)' if result.timed_out else ''}: {result.output[-600:]}")
    return output.epochs(result.stdout), result.seconds, problem


def describe(epochs: list[output.Epoch]) -> str:
    last = epochs[-1]
    return (f"epoch {last.epoch}: {last.images_per_sec:,.0f} images/s, epoch time {last.epoch_time:.1f} s, "
            f"val accuracy {last.val_accuracy:.4f}")


def training(report: Report, gpus: int, data_dir: Path) -> None:
    report.add("\n## Training the finished solution (--widen-factor 10, 2 epochs)\n")
    report.add("| run | verdict | measured |\n| --- | --- | --- |")
    rates: dict[int, float] = {}
    for n in sorted({gpus, 1}, reverse=True):
        epochs, seconds, problem = train(n, data_dir, 2)
        if problem or not epochs:
            report.row(f"{n} GPU(s)", "FAIL", problem or "no epoch line printed")
            continue
        rates[n] = epochs[-1].images_per_sec
        report.row(f"{n} GPU(s)", "pass", f"{describe(epochs)}; whole run {seconds:.0f} s")
    if gpus > 1 and len(rates) == 2:
        speedup = rates[gpus] / rates[1]
        report.row("speedup", "pass", f"{speedup:.2f}x on {gpus} GPUs (efficiency {speedup / gpus:.0%}), "
                   "from the second epoch's images/sec")
    else:
        report.row("speedup", "n/a", "one GPU on this machine: nothing to compare")
    epochs, seconds, problem = train(gpus, data_dir, 1, "--sync-bn")
    report.row(f"--sync-bn on {gpus} GPU(s)", "FAIL" if problem or not epochs else "pass",
               problem or (f"{describe(epochs)}; whole run {seconds:.0f} s" if epochs else "no epoch line printed"))


def checks(report: Report, gpus: int) -> None:
    planned = devices.plan(gpus, 2, 2)
    on_gpu = any(planned.values())  # the GPU parts of Steps 4 and 7 show in the workers run, else the program run
    runs = "; ".join(f"{run} run on {devices.describe(assigned)}" for run, assigned in planned.items())
    report.add(f"\n## The checker ({runs})\n")
    report.add("| what | verdict | observed |\n| --- | --- | --- |")
    started = time.monotonic()
    results = api.check_steps(None, SOLUTION, fresh=True, quiet=True)
    for r in results:
        verdict = "FAIL" if r.passed is False else r.status
        report.row(f"solution, Step {r.step}", verdict, r.observed)
    report.add(f"\n(all steps in {time.monotonic() - started:.0f} s)\n")
    # the scaling part's speedup item: judged only with 2 GPUs or more (its threshold is set from these runs)
    started = time.monotonic()
    (speedup,) = api.check_steps(["speedup"], paths.REPO / "solutions" / "large_batch_training.py", fresh=True,
                                 quiet=True)
    report.row("large_batch_training.py, speedup (2 GPUs over 1)", "FAIL" if speedup.passed is False else speedup.status,
               f"{speedup.observed} ({time.monotonic() - started:.0f} s)")
    report.add("")
    report.add("| mistake | verdict | observed |\n| --- | --- | --- |")
    catalogue, gpu_only = _mistakes()
    with tempfile.TemporaryDirectory() as folder:
        for name in MISTAKES:
            mistake = catalogue.get(name)
            if mistake is None:
                report.row(f"mistake {name}", "n/a", "not in tests/mistakes.py")
                continue
            if name in gpu_only and not on_gpu:
                report.row(f"mistake {name}", "n/a", "shows only in a run on GPUs (2 GPUs or more)")
                continue
            script = Path(folder) / f"{name}.py"
            script.write_text(mistake.apply(SOLUTION.read_text()))  # type: ignore[attr-defined]
            (result,) = api.check_steps([mistake.step], script, fresh=True, quiet=True)  # type: ignore[attr-defined]
            caught = result.passed is False and mistake.expect in result.observed  # type: ignore[attr-defined]
            report.row(f"mistake {name} (Step {result.step})", "pass" if caught else "FAIL",
                       ("caught: " if caught else "NOT caught: ") + result.observed)


def notebooks(report: Report) -> None:
    report.add("\n## Notebooks under nbval, quick mode off\n")
    report.add("| notebook | verdict | detail |\n| --- | --- | --- |")
    if importlib.util.find_spec("nbval") is None:
        for name in NOTEBOOKS:
            report.row(name, "n/a", "nbval is not installed here (pip install -r requirements-test.txt)")
        return
    from autograde.tools.nbval_runner import learner_copy

    with tempfile.TemporaryDirectory() as folder:
        course = learner_copy(Path(folder))
        for name in NOTEBOOKS:
            cmd = [processes.PYTHON, "-m", "pytest", "--nbval-lax", "--nbval-cell-timeout=3600", "-p", "no:cacheprovider",
                   "-q", "-o", "addopts=", f"notebooks/{name}"]
            result = processes.run(cmd, cwd=course, timeout=3 * 3600, env={"DDP_LAB_QUICK": "0"})
            last = next((line for line in reversed(result.stdout.splitlines()) if line.strip()), "(no output)")
            report.row(name, "pass" if result.returncode == 0 else "FAIL", f"{last} ({result.seconds:.0f} s)")


def machine_lines(gpus: int) -> list[str]:
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    smi = shutil.which("nvidia-smi")
    driver = processes.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                        timeout=60).stdout.split("\n")[0].strip() if smi else "unknown"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "unknown"
    return [f"- GPUs: {gpus} x {', '.join(sorted(set(names)))}",
            f"- PyTorch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, driver {driver}",
            f"- CPU cores: {os.cpu_count()}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.tools.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "gpu-report.md", help="where the report goes")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data",
                        help="real Fashion-MNIST here is used; otherwise a full-size stand-in in <data-dir>/synthetic")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS,
                        help="what to run (default: all of it; the notebooks take longest)")
    args = parser.parse_args(argv)
    gpus = api.gpu_count()
    if gpus == 0:
        print("make gpu-check: no GPU on this machine; it proves the GPU path on a machine with NVIDIA GPUs. Nothing done.")
        return 0
    report = Report()
    report.add(f"# GPU report: {datetime.date.today().isoformat()}\n")
    report.add("Written by `make gpu-check` (autograde/tools/gpu_check.py) on the machine below.\n")
    for line in machine_lines(gpus):
        report.add(line)
    data_dir, synthetic = data.choose(args.data_dir)
    what = "the synthetic stand-in (60,000 + 10,000 images; not Fashion-MNIST)" if synthetic else "Fashion-MNIST"
    report.add(f"- data: {what}, in {data_dir}")
    parts = {"training": lambda: training(report, gpus, data_dir), "checks": lambda: checks(report, gpus),
             "notebooks": lambda: notebooks(report)}
    for name in PARTS:
        if name in args.parts:
            parts[name]()
        else:
            report.add(f"\n({name}: left out by --parts)")
    verdict = f"FAILED: {', '.join(report.failures)}" if report.failures else "everything that can run here passed"
    report.add(f"\n**{verdict}**")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(report.lines) + "\n")
    print(f"report: {args.report}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
