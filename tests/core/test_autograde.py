"""The step checks, run for real on the lab's own files and on typical mistakes."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import ROOT, SOLUTION, STARTER
from mistakes import EXERCISE_MISTAKES, MISTAKES, Mistake

from autograde.engine import processes
from autograde.engine.verdicts import Result
from autograde.grading import api, cache, registry
from autograde.parts.lab import runs as lab_runs

# How far each file of the lab gets: all steps up to its own, and not the next one.
ORDER = [s for s in registry.FIRST_ITEMS if s != "optional"]
# The starter and each checkpoint passing its steps and failing the next: on recorded runs, in
# tests/core/test_checks_recorded.py. Launched here: the solution (every kind of run), the mistakes.


def test_the_launched_mistakes_are_catalogued() -> None:
    assert set(LAUNCHED) <= {m.name for m in MISTAKES}


@pytest.mark.launch
def test_finished_solution_passes_everything_from_the_command_line() -> None:
    result = processes.run([processes.PYTHON, "-m", "autograde", "check", "--all", "--json", "--script", SOLUTION],
                        timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.output
    verdicts = {r["step"]: r["status"] for r in json.loads(result.stdout)}
    assert verdicts == {**{s: "pass" for s in ORDER}, "optional": "n/a"}


# Launched for real: one mistake for each kind of run the lab's checks read (setup, workers,
# program), and the ones that hang or crash a rank. Every catalogued mistake, in both styles, is
# judged on its recorded runs in tests/core/test_checks_recorded.py: launching the other 17 as well
# proved nothing those replays do not, and cost about 6 minutes of make test.
LAUNCHED = ("no_master_port", "download_on_every_rank", "no_set_epoch", "early_stop_on_rank_0_only",
            "spawn_wrong_nprocs", "spawn_without_main_guard")


@pytest.mark.launch
@pytest.mark.parametrize("mistake", [m for m in MISTAKES if m.name in LAUNCHED], ids=list(LAUNCHED))
def test_a_typical_mistake_fails_its_step_with_the_right_message(mistake: Mistake, tmp_path: Path) -> None:
    """The mistake, made in the lab's solution, fails its own step with the right words, and not
    because of an earlier step (unless it really breaks one). Made in the original lab's style
    too, it fails with the same words: on recorded runs, in tests/core/test_checks_recorded.py."""
    script = tmp_path / "fashion_mnist.py"
    script.write_text(mistake.apply(SOLUTION.read_text()))
    started = time.monotonic()
    results = {r.step: r for r in api.check_steps([mistake.step], script)}
    verdict = results[mistake.step]
    assert verdict.passed is False, f"{mistake.name}: Step {mistake.step} passed: {verdict.observed}"
    assert mistake.expect in verdict.observed, verdict.observed
    if mistake.also_fails:
        for step, words in mistake.also_fails:
            (earlier,) = api.check_steps([step], script)
            assert earlier.passed is False and words in earlier.observed, earlier.observed
    else:
        assert "is not right yet" not in verdict.observed, f"an earlier step failed instead: {verdict.observed}"
    assert time.monotonic() - started < 150, "the check took too long: it must stop a hang itself"


def test_assert_step_raises_with_the_failure_message(capsys: pytest.CaptureFixture[str]) -> None:
    api.assert_step(0, SOLUTION)
    assert capsys.readouterr().out == "Step 0: pass: imports torch.distributed\n"
    with pytest.raises(AssertionError, match="Step 0: the script does not import torch.distributed"):
        api.assert_step("0", STARTER)


@pytest.mark.launch
def test_several_steps_at_once_from_the_command_line() -> None:
    result = processes.run([processes.PYTHON, "-m", "autograde", "check", "--step", "0", "1", "--json", "--script", SOLUTION],
                        timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.output
    assert [(r["step"], r["status"]) for r in json.loads(result.stdout)] == [("0", "pass"), ("1", "pass")]


@pytest.mark.launch
def test_three_processes_on_one_node_as_a_grader_may_ask() -> None:
    results = api.check_steps(["4", "6", "9"], SOLUTION, procs_per_node=3, nodes=1)
    assert all(r.passed for r in results), [r.observed for r in results]
    assert "3 processes joined as ranks 0-2 of 3" in results[0].observed


@pytest.mark.launch
def test_bad_arguments_get_one_line(tmp_path: Path) -> None:
    unknown = processes.run([processes.PYTHON, "-m", "autograde", "check", "--step", "11"], timeout=60, cwd=ROOT)
    assert unknown.returncode == 2 and "unknown step '11'" in unknown.stderr and "Traceback" not in unknown.output
    layout = processes.run([processes.PYTHON, "-m", "autograde", "check", "--procs-per-node", "0"], timeout=60, cwd=ROOT)
    assert layout.returncode == 2 and "at least 1" in layout.stderr and "Traceback" not in layout.output
    missing = processes.run([processes.PYTHON, "-m", "autograde", "check", "--script", tmp_path / "nope.py"],
                         timeout=60, cwd=ROOT)
    assert missing.returncode == 2 and "no script at" in missing.stderr and "Traceback" not in missing.output


@pytest.mark.launch
def test_the_learners_folder_is_left_alone(tmp_path: Path) -> None:
    script = tmp_path / "fashion_mnist.py"
    script.write_text(SOLUTION.read_text())
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    api.check_steps(["0", "5"], script)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


@pytest.mark.launch
def test_a_deadlock_names_each_rank_and_the_call_it_waits_in(tmp_path: Path) -> None:
    (mistake,) = [m for m in MISTAKES if m.name == "epoch_barrier_on_rank_0_only"]
    script = tmp_path / "fashion_mnist.py"
    script.write_text(mistake.apply(SOLUTION.read_text()))
    (verdict,) = api.check_steps(["8"], script)
    assert "deadlocked" in verdict.observed and "rank 0 in dist.barrier() (line" in verdict.observed, verdict.observed


@pytest.mark.launch
def test_a_script_that_hangs_is_stopped_and_reported(tmp_path: Path) -> None:
    script = tmp_path / "fashion_mnist.py"
    text = SOLUTION.read_text().replace("def worker(local_rank, args):\n",
                                        "def worker(local_rank, args):\n    time.sleep(3600)\n", 1)
    script.write_text(text)
    started = time.monotonic()
    (verdict,) = api.check_steps(["4"], script)
    assert time.monotonic() - started < 90
    assert verdict.passed is False and "deadlocked" in verdict.observed, verdict.observed


@pytest.mark.launch
def test_verdicts_are_reused_for_the_same_file_and_redone_after_an_edit(tmp_path: Path) -> None:
    script = tmp_path / "fashion_mnist.py"
    script.write_text(SOLUTION.read_text() + "# bytes of its own: the solution's verdicts are kept by other tests\n")
    layout = api.devices_key(processes.gpu_count())
    assert cache.load(script, 2, 2, layout) == {}
    (step_4,) = api.check_steps(["4"], script)
    # the run made for Step 4 answered, and kept, every step that reads only that run
    kept = cache.load(script, 2, 2, layout)
    assert {"0", "3", "4", "5", "6", "6.5", "7", "8", "9"} <= set(kept) and kept["4"] == step_4
    script.write_text(SOLUTION.read_text().replace("import torch.distributed as dist\n", "", 1))
    assert cache.load(script, 2, 2, layout) == {}  # another file: nothing known yet
    (step_0,) = api.check_steps(["0"], script)
    assert step_0.passed is False


@pytest.mark.launch
def test_an_item_asked_makes_only_the_runs_it_reads(tmp_path: Path) -> None:
    """The three ddp_by_hand items read runs of one kind, each of its own wrapper: checking
    naive_ddp runs NaiveDDP alone, and the other two, whose runs were not made, are left to be
    judged when asked (nothing kept for them), not judged by making their runs too."""
    script = tmp_path / "ddp_by_hand.py"
    script.write_text((ROOT / "solutions" / "ddp_by_hand.py").read_text() + "# bytes of its own\n")
    (verdict,) = api.check_steps(["naive_ddp"], script)
    assert verdict.passed is True, verdict.observed
    kept = cache.load(script, 2, 2, api.devices_key(processes.gpu_count()))
    assert set(kept) == {"naive_ddp"}, sorted(kept)


def test_a_failing_verdict_renders_without_the_checkers_frames() -> None:
    failure = api.CheckFailed(Result("6.5", False, "rank 0's training sampler had epoch 0 in every epoch",
                                            "see `# TODO Step 6.5`: call train_sampler.set_epoch(epoch)"))
    shown = "\n".join(failure._render_traceback_())  # what IPython (and nbgrader's feedback) shows
    assert "Step 6.5 FAIL" in shown and "epoch 0 in every epoch" in shown and "hint: see `# TODO Step 6.5`" in shown
    assert "Traceback" not in shown and "autograde" not in shown and str(ROOT) not in shown
    assert isinstance(failure, AssertionError)  # grading fails the cell


def test_the_progress_table_names_the_next_step_and_its_hint_once() -> None:
    results = [Result("0", True, "imports torch.distributed"),
               Result("1", False, "the script has no --num-nodes option", "see `# TODO Step 1`: add it"),
               Result("2", False, "MASTER_ADDR is not set (Step 1 is not right yet either: ...)",
                             "see `# TODO Step 1`: add it", earlier="1")]
    table = api.progress_table(results)
    assert table.count("<tr>") == 4 and "needs Step 1 first" in table and "is not right yet" not in table
    assert table.count("see `# TODO Step 1`") == 1 and "1 of 3 steps pass; next: Step 1" in table


KILL_SWITCH = '''
if os.environ.get("KILL_COUNTER"):  # stands in for a process killed from outside, as many times as asked
    _counter = __import__("pathlib").Path(os.environ["KILL_COUNTER"])
    if int(_counter.read_text()) > 0 and __name__ == "__mp_main__":
        _counter.write_text(str(int(_counter.read_text()) - 1))
        os.kill(os.getpid(), __import__("signal").SIGKILL)
'''


@pytest.mark.launch
def test_a_run_killed_from_outside_is_made_again_then_blamed_on_the_checker(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fashion_mnist.py"
    script.write_text(SOLUTION.read_text().replace("\ndef main():", KILL_SWITCH + "\n\ndef main():", 1))
    counter = tmp_path / "kills"
    monkeypatch.setenv("KILL_COUNTER", str(counter))
    counter.write_text("1")  # the first attempt is killed, the second is not: a pass, and kept
    (verdict,) = api.check_steps(["10"], script)
    assert verdict.passed is True, verdict.observed
    counter.write_text("99")  # killed every time: the checker's error, never the learner's FAIL, never kept
    (verdict,) = api.check_steps(["10"], script, fresh=True)
    assert verdict.status == "ERROR" and verdict.checker_error, verdict.observed
    assert "SIGKILL" in verdict.observed and "checker's problem, not your script's" in verdict.observed
    assert "10" not in cache.load(script, 2, 2, api.devices_key(processes.gpu_count()))


@pytest.mark.launch
def test_state_made_under_main_is_missing_in_the_workers_as_under_mp_spawn(tmp_path: Path) -> None:
    """Each simulated process imports the script afresh as __mp_main__: a global that only the
    `if __name__ == "__main__":` block sets is not there, and the run fails with the real error."""
    script = tmp_path / "fashion_mnist.py"
    text = SOLUTION.read_text().replace("    rank = args.node_id * args.num_gpus + local_rank\n",
                                        "    rank = args.node_id * args.num_gpus + local_rank + OFFSET\n", 1)
    script.write_text(text.replace('if __name__ == "__main__":\n', 'if __name__ == "__main__":\n    OFFSET = 0\n', 1))
    (verdict,) = api.check_steps(["4"], script)
    assert verdict.passed is False and "NameError: name 'OFFSET' is not defined" in verdict.observed, verdict.observed


@pytest.mark.launch
def test_module_level_arguments_are_each_nodes_own(tmp_path: Path) -> None:
    """The vendor lab's shape: the command line parsed at module level, the world size in a
    module-level variable. Each simulated process sees its own node's arguments."""
    script = tmp_path / "fashion_mnist.py"
    text = SOLUTION.read_text()
    text = text.replace("    rank = args.node_id * args.num_gpus + local_rank\n",
                        "    rank = NODE_ID * args.num_gpus + local_rank\n", 1)
    text = text.replace("rank=rank, world_size=args.world_size,", "rank=rank, world_size=WORLD_SIZE,", 1)
    text = text.replace("\ndef main():", "\n_ARGS, _ = argparse.ArgumentParser(add_help=False).parse_known_args()\n"
                        "NODE_ID = next((int(v) for k, v in zip(sys.argv, sys.argv[1:]) if k == '--node-id'), 0)\n"
                        "WORLD_SIZE = next((int(v) for k, v in zip(sys.argv, sys.argv[1:]) if k == '--num-nodes'), 1) * "
                        "next((int(v) for k, v in zip(sys.argv, sys.argv[1:]) if k == '--num-gpus'), 1)\n\n"
                        "def main():", 1)
    script.write_text(text)
    results = api.check_steps(["2", "4"], script)
    assert all(r.passed for r in results), [r.observed for r in results]


@pytest.mark.launch
def test_the_options_a_script_accepts_come_from_its_own_parser(tmp_path: Path) -> None:
    """What lab.train passes (--master-port from Step 2 on) is decided by the script's parser,
    not its text: single quotes, or an option the starter lacks, are told apart."""
    script = tmp_path / "fashion_mnist.py"
    script.write_text(SOLUTION.read_text().replace('"--master-port"', "'--master-port'"))
    assert "'--master-port'" in script.read_text()
    assert "--master-port" in lab_runs.script_options(script)
    assert "--master-port" not in lab_runs.script_options(STARTER)


@pytest.mark.launch
def test_an_exercise_is_checked_by_launching_its_file_as_a_learner_would() -> None:
    """`make check STEP=pi` finds exercises/compute_pi.py by itself, launches it (the launched kind
    of run; every other verdict on it is replayed in tests/core/test_checks_recorded.py), and points
    at the exercise's TODO."""
    result = processes.run(["make", "--no-print-directory", "-s", "check", "STEP=pi"], cwd=ROOT, timeout=600,
                        env={"DDP_LAB_FRESH": "1"})
    assert result.returncode != 0, result.output
    assert "# TODO pi" in result.output and "Step pi" not in result.output and "of the work" in result.output, result.output


@pytest.mark.launch
def test_a_ring_that_deadlocks_is_stopped_with_each_ranks_call_named(tmp_path: Path) -> None:
    """Every rank sending first with a blocking dist.send waits forever for its neighbour: the
    check stops the processes after its stall time (not the group's 60 s timeout), names the call
    and line each rank waits in, and leaves nothing running (the replayed recording of the same
    mistake cannot show the stop itself)."""
    (mistake,) = [m for m in EXERCISE_MISTAKES if m.name == "ring_blocking_send_first"]
    script = tmp_path / "ring_allreduce.py"
    script.write_text(mistake.apply((ROOT / "solutions" / "ring_allreduce.py").read_text()))
    result = processes.run(["make", "--no-print-directory", "-s", "check", "STEP=ring", f"SCRIPT={script}"], cwd=ROOT,
                        timeout=300, env={"DDP_LAB_FRESH": "1"})
    assert result.returncode != 0 and "deadlocked" in result.output, result.output
    assert "rank 0 in dist.send() (line" in result.output and "rank 1 in dist.send() (line" in result.output, result.output
    assert not result.leftover, "processes were left running"
