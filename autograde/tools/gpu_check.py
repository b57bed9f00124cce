"""`make gpu-check`: prove the lab's GPU path on a machine with NVIDIA GPUs, and write a report.

CI has no GPU, so this is the only place where the NCCL path of the finished solution, the
checker on GPUs and the notebooks with quick mode off ever run. On the GPU node the course
will use, an instructor runs it once before the course. It:

1. trains the finished solution for 2 epochs of the full model (--widen-factor 10) on every GPU,
   and on one GPU, and reports images/sec, epoch time and the speedup;
2. trains 1 epoch with --sync-bn (the Optional step) on every GPU;
3. checks the finished solution, every step, and runs the tests' GPU checks (tests/parts/lab/test_gpu_mistakes.py:
   three catalogued mistakes that must fail), through pytest in a process of their own;
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
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from autograde import data, settings
from autograde.engine import output, processes
from autograde.grading import api
from autograde.parts.lab import runs as lab_runs

REPO, SOLUTION = settings.REPO, settings.SOLUTION
NOTEBOOKS = ["02_baseline.ipynb", "06_step_7_ddp.ipynb", "09_evaluation.ipynb"]
# The tests' own GPU checks (catalogued mistakes live with the tests): run as a pytest command, never
# imported, so that the package holds nothing of tests/. A path relative to REPO, the command's folder.
GPU_TESTS = "tests/parts/lab/test_gpu_mistakes.py"
GPU_TESTS_LIMIT = 3600.0  # three checks of the lab, each well within pytest.ini's 900 s a test
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
    planned = lab_runs.devices_plan(gpus, 2, 2)
    runs = "; ".join(f"{run} run on {lab_runs.describe(assigned)}" for run, assigned in planned.items())
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
    (speedup,) = api.check_steps(["speedup"], settings.REPO / "solutions" / "large_batch_training.py", fresh=True,
                                 quiet=True)
    report.row("large_batch_training.py, speedup (2 GPUs over 1)", "FAIL" if speedup.passed is False else speedup.status,
               f"{speedup.observed} ({time.monotonic() - started:.0f} s)")
    gpu_tests(report)


def gpu_tests(report: Report) -> None:
    """The tests' GPU checks, through pytest in a process of its own: a row for each test case, `n/a`
    with its reason where it skipped (a mistake that only the checker's GPU mode shows, on a machine
    whose checker runs on the CPU)."""
    report.add("")
    report.add(f"| {GPU_TESTS} | verdict | observed |\n| --- | --- | --- |")
    if importlib.util.find_spec("pytest") is None:
        report.row(GPU_TESTS, "n/a", "pytest is not installed here (pip install -r requirements-test.txt)")
        return
    with tempfile.TemporaryDirectory() as folder:
        junit = Path(folder) / "junit.xml"
        cmd = [processes.PYTHON, "-m", "pytest", GPU_TESTS, "-p", "no:cacheprovider", "-q", "-o", "addopts=",
               "-o", "junit_logging=system-out", f"--junitxml={junit}"]
        result = processes.run(cmd, cwd=REPO, timeout=GPU_TESTS_LIMIT)
        rows = junit_rows(junit.read_text()) if junit.is_file() else []
    for what, verdict, detail in rows:
        report.row(what, verdict, detail)
    if not rows:
        tail = " ".join(result.output.split()[-60:])
        ended = "time limit" if result.timed_out else f"exit status {result.returncode}"
        report.row(GPU_TESTS, "FAIL", f"no test ran ({ended}): {tail}")


def junit_rows(junit_xml: str) -> list[tuple[str, str, str]]:
    """(test, verdict, detail) of each test case in pytest's JUnit XML: a skip is `n/a` with its reason,
    a failure or error `FAIL` with its message's first line, a pass `pass` with the last line it printed."""
    rows = []
    for case in ElementTree.fromstring(junit_xml).iter("testcase"):
        name = case.get("name", "?")
        skipped = case.find("skipped")
        failed = next((e for e in (case.find("failure"), case.find("error")) if e is not None), None)
        printed = [line for e in case.findall("system-out") for line in (e.text or "").splitlines()
                   if line.strip() and not line.startswith("---")]
        if skipped is not None:
            rows.append((name, "n/a", skipped.get("message", "")))
        elif failed is not None:
            first = (failed.get("message") or failed.text or "").strip().splitlines()[:1]
            rows.append((name, "FAIL", (first[0] if first else "").removeprefix("AssertionError: ")
                         .removeprefix("Failed: ")))
        else:
            rows.append((name, "pass", printed[-1] if printed else ""))
    return rows


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
            result = processes.run(cmd, cwd=course, timeout=3 * 3600, env={settings.QUICK: "0"})
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
    gpus = processes.gpu_count()
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
