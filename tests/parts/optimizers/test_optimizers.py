"""The helpers of notebooks 24-26 (autograde/parts/optimizers/notebook.py) for real, and the notebooks'
claims about PyTorch and about the arithmetic of K-FAC, checked against the installed torch: the
Kronecker identities the derivation uses, the eigenbasis formula against the dense solve, a
cross-entropy layer's G without an inverse, LARS's first step, eigh's column-major eigenvectors and
what a gloo broadcast makes of them, and what a traced K-FAC run communicates."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import ROOT

from autograde.engine.run import Run
from autograde.jupyter import runtime
from autograde.parts.optimizers import notebook as optimizers
from autograde.parts.optimizers import notebook_kfac as kfac_notebook
from autograde.protocol import ProcessTrace

pytestmark = pytest.mark.timeout(120)
MLP_FACTORS = 785 ** 2 + 128 ** 2 + 129 ** 2 + 64 ** 2 + 65 ** 2 + 10 ** 2  # A and G of exercises/kfac.py's MLP
MLP_PARAMETERS = 785 * 128 + 129 * 64 + 65 * 10


@pytest.fixture
def course(monkeypatch: pytest.MonkeyPatch, stand_in: Path) -> Path:
    """The helpers find the course's files from the repository and read the small stand-in."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(runtime, "data_dir", lambda: (stand_in, True))
    return stand_in


# Notebook 25's derivation -----------------------------------------------------------------------

def vec(x: torch.Tensor) -> torch.Tensor:
    """The columns of x stacked: the vec of the notebooks."""
    return x.t().reshape(-1)


def test_a_product_with_a_kronecker_product_is_two_small_products() -> None:
    """(P kron Q) vec(X) = vec(Q X P^T), and the mixed product (P kron Q)(R kron S) = PR kron QS."""
    torch.manual_seed(0)
    p, q, x = (torch.randn(3, 3, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64),
               torch.randn(4, 3, dtype=torch.float64))
    assert torch.allclose(torch.kron(p, q) @ vec(x), vec(q @ x @ p.t()))
    r, s = torch.randn(3, 3, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    assert torch.allclose(torch.kron(p, q) @ torch.kron(r, s), torch.kron(p @ r, q @ s))


def test_one_samples_gradient_is_a_kron_g() -> None:
    """For y = W a, the weights' gradient is g a^T, whose vec is a kron g, and its outer product
    (a a^T) kron (g g^T): the block K-FAC factors."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 3, bias=False).double()
    a = torch.randn(1, 5, dtype=torch.float64)
    out = layer(a)
    out.retain_grad()
    (out ** 2).sum().backward()
    g = out.grad[0]
    assert torch.allclose(layer.weight.grad, torch.outer(g, a[0]))
    assert torch.allclose(vec(layer.weight.grad), torch.kron(a[0], g))
    v = vec(layer.weight.grad)
    assert torch.allclose(torch.outer(v, v), torch.kron(torch.outer(a[0], a[0]), torch.outer(g, g)))


def test_the_eigenbasis_formula_equals_the_dense_solve(capsys: pytest.CaptureFixture[str]) -> None:
    """Notebook 25's cell: the two ways agree to rounding, for several layers and dampings."""
    for inputs, outputs, damping in ((6, 4, 1e-3), (9, 5, 0.1), (3, 7, 1e-5)):
        found = kfac_notebook.small_layer(inputs, outputs, batch=32, damping=damping)
        assert found.dense.shape == (outputs, inputs + 1) == found.grad.shape
        assert found.difference < 1e-9, (inputs, outputs, damping, found.difference)
    assert "largest difference" in capsys.readouterr().out


def test_a_cross_entropy_layers_g_has_no_inverse_without_damping() -> None:
    """Each sample's output gradients sum to 0 over the classes: G has an eigenvalue of 0, and
    A kron G is singular; with damping the solve works."""
    found = kfac_notebook.small_layer(6, 4, batch=32, damping=1e-3)
    values = torch.linalg.eigvalsh(found.G)
    assert abs(values[0]) < 1e-12 * values[-1] and values[1] > 1e-6
    assert torch.linalg.matrix_rank(torch.kron(found.A, found.G)) < len(found.A) * len(found.G)


def test_factors_follow_the_definitions() -> None:
    """A = mean of a a^T with a 1 appended for the bias; G = mean of g g^T, g = B x the output's gradient."""
    torch.manual_seed(1)
    layer = nn.Linear(4, 3).double()
    x = torch.randn(8, 4, dtype=torch.float64)
    target = torch.randint(3, (8,))
    A, G, grad = kfac_notebook.factors(layer, x, lambda out: F.cross_entropy(out, target))
    a = torch.cat([x, torch.ones(8, 1, dtype=torch.float64)], dim=1)
    assert torch.allclose(A, sum(torch.outer(r, r) for r in a) / 8)
    per_sample = [torch.autograd.grad(F.cross_entropy(layer(x[i:i + 1]), target[i:i + 1]), layer.weight)[0] for i in range(8)]
    g_rows = torch.softmax(layer(x), dim=1).detach() - F.one_hot(target, 3)
    assert torch.allclose(per_sample[0], torch.outer(g_rows[0], x[0]))  # g is one sample's own output gradient
    assert torch.allclose(G, g_rows.t() @ g_rows / 8)
    assert torch.allclose(grad[:, :4], sum(per_sample) / 8)


def test_the_solutions_kfac_preconditions_as_the_formula_says() -> None:
    """The notebook's eigen_solve is the solution's preconditioning: one KFAC step on one layer."""
    spec_module: Any = _solution_kfac()
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 4)).double()
    kfac = spec_module.KFAC(model, damping=0.01)
    x, target = torch.randn(16, 5, dtype=torch.float64), torch.randint(4, (16,))
    F.cross_entropy(model(x), target).backward()
    A, G, grad = kfac_notebook.factors(model[0], x, lambda out: F.cross_entropy(out, target))
    kfac.step()
    expected = kfac_notebook.dense_solve(A, G, grad, 0.01)
    got = torch.cat([model[0].weight.grad, model[0].bias.grad[:, None]], dim=1)
    assert torch.allclose(got, expected, atol=1e-10)


def _solution_kfac() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("solution_kfac", ROOT / optimizers.KFAC_SOLUTION)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_block_sizes_of_the_mlp(capsys: pytest.CaptureFixture[str]) -> None:
    """Notebook 25's table: the first layer's block holds 100,480^2 numbers (40 GB in float32), its
    factors 632,609, and all the factors of the MLP are what a traced refresh all-reduces."""
    rows = kfac_notebook.block_sizes()
    assert rows[0]["block"] == 100_480 ** 2 and rows[0]["block"] * 4 > 40e9 and rows[0]["factors"] == 632_609
    assert sum(r["factors"] for r in rows) == MLP_FACTORS
    assert sum(r["weights"] for r in rows) == MLP_PARAMETERS == 109_386
    assert "10,096,230,400" in capsys.readouterr().out


# Notebook 26's claims about eigh and broadcast ----------------------------------------------------

def test_eighs_eigenvectors_are_column_major() -> None:
    """eigh's eigenvectors have strides (1, n): not contiguous, in float32 and float64 alike;
    .contiguous() lays them out row by row, with the same values."""
    for dtype in (torch.float32, torch.float64):
        m = torch.randn(5, 5, dtype=dtype)
        _, vectors = torch.linalg.eigh(m @ m.t())
        assert vectors.stride() == (1, 5) and not vectors.is_contiguous()
        assert vectors.contiguous().stride() == (5, 1) and torch.equal(vectors.contiguous(), vectors)
    assert kfac_notebook.eigh_layout(4).stride() == (1, 4)


def test_the_first_layers_decomposition_outweighs_the_others() -> None:
    """Notebook 26: eigh of the first layer's A (785 rows, float64) takes longer than those of the
    MLP's five other factors together."""
    def seconds(n: int) -> float:
        m = torch.randn(n, n, dtype=torch.float64)
        m = m @ m.t()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            torch.linalg.eigh(m)
            best = min(best, time.perf_counter() - start)
        return best

    assert seconds(785) > sum(seconds(n) for n in (129, 65, 128, 64, 10))


@pytest.mark.launch
def test_a_broadcast_of_eighs_eigenvectors_arrives_transposed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two gloo processes: sent as eigh returns them, rank 1 gets the transpose, with no error;
    made contiguous first, the matrix itself."""
    monkeypatch.chdir(ROOT)
    found = kfac_notebook.broadcast_demo()
    assert found["as eigh returns them"] == {"equal": False, "transposed": True}
    assert found["after .contiguous()"] == {"equal": True, "transposed": False}


# Notebook 24: LARS -----------------------------------------------------------------------------

def test_lars_first_step_is_lr_times_eta_of_every_weight(course: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The solution's LARS moves every weight by just under lr x eta of its norm at the first step
    (at most, by the triangle inequality); SGD's relative steps differ from layer to layer."""
    found = optimizers.relative_steps("mlp", lr_sgd=0.1, lr_lars=8.0, batch_size=128, script=optimizers.LARS_SOLUTION)
    assert set(found["LARS"]) == {"1.weight", "3.weight", "5.weight"}
    assert all(0.007 < step <= 0.008 + 1e-7 for step in found["LARS"].values()), found
    sgd = found["SGD"].values()
    assert max(sgd) / min(sgd) > 1.2, found
    assert "LARS: |step| / |w|" in capsys.readouterr().out


def test_layer_norms_and_their_figure(course: Path) -> None:
    layers = optimizers.layer_norms("mlp", batch_size=64)
    assert [layer.shape for layer in layers] == [(128, 784), (64, 128), (10, 64)]
    assert all(layer.ratio > 0 and layer.grad_norm > 0 for layer in layers)
    fig = optimizers.ratios(layers)
    assert len(fig.axes[0].patches) == 3


# Logs, tables, figures ---------------------------------------------------------------------------

LOGS = {"SGD": [{"epoch": 1, "steps": 4, "seconds": 2.0, "accuracy": 0.5}, {"epoch": 2, "steps": 8, "seconds": 4.0, "accuracy": 0.75}],
        "SGD + K-FAC": [{"epoch": 1, "steps": 4, "seconds": 3.0, "accuracy": 0.6}, {"epoch": 2, "steps": 8, "seconds": 6.4, "accuracy": 0.9}]}


def test_read_log_table_and_accuracy_figure(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in LOGS["SGD"]) + "\n")
    assert optimizers.read_log(path) == LOGS["SGD"]
    lines = optimizers.table(LOGS).splitlines()
    assert lines[0].split() == ["run", "epoch", "1", "epoch", "2", "ms", "a", "step"]
    assert lines[1].split() == ["SGD", "50.0%", "75.0%", "500"]  # 4.0 s over 8 steps
    assert lines[2].split()[-1] == "800"
    assert len(optimizers.accuracy(LOGS).axes) == 2 and len(optimizers.accuracy(LOGS, by_time=False).axes) == 1


def _event(t: float, ev: str, **fields: object) -> dict[str, object]:
    return {"t": t, "ev": ev, **fields}


def _traced_run(update_freq: int, steps: int) -> Run:
    """Rank 0's trace of a K-FAC run as the tracer writes it: a refresh all-reduces two factors
    (4 x 4 and 2 x 2) and broadcasts four tensors; every step ends with a "step" event."""
    events = [_event(0, "exit", call="init_process_group", world_size=2, rank_joined=0),
              _event(0.1, "enter", call="broadcast"), _event(0.2, "exit", call="broadcast"),  # not K-FAC's: before DDP
              _event(0.5, "ddp")]
    t = 1.0
    for step in range(steps):
        if step % update_freq == 0:
            for numel in (16, 4):
                events += [_event(t, "enter", call="all_reduce", numel=numel), _event(t + 0.01, "exit", call="all_reduce")]
                t += 0.02
            for _ in range(4):
                events += [_event(t, "enter", call="broadcast"), _event(t + 0.005, "exit", call="broadcast")]
                t += 0.01
        t += 0.1
        events.append(_event(t, "step", n=step + 1))
    return Run("K-FAC run", [], {1: ProcessTrace(1, events)})


def test_communication_is_read_step_by_step_from_rank_0s_trace() -> None:
    found = kfac_notebook._communication(_traced_run(update_freq=3, steps=7), 3, gradients=100)
    assert found.factors == [20, 0, 0, 20, 0, 0, 20]
    assert found.broadcasts == [4, 0, 0, 4, 0, 0, 4]
    assert found.decompositions == [16 + 4 + 4 + 2, 0, 0, 26, 0, 0, 26]
    assert found.seconds[0] == pytest.approx(0.04) and found.seconds[1] == 0
    assert len(found.step_seconds) == 6
    assert found.per_step() == pytest.approx(100 + 3 * 46 / 7)
    fig = kfac_notebook.communication_figure([found])
    assert len(fig.axes[0].patches) == 3 * 7


def test_the_prediction_is_shown_beside_the_measured_floats(capsys: pytest.CaptureFixture[str]) -> None:
    """K-FAC's own floats a step (factors measured, decompositions computed), DDP's gradients left
    out; a learner's function that raises is said, and the table goes on."""
    found = kfac_notebook._communication(_traced_run(update_freq=3, steps=7), 3, gradients=100)
    asked = []

    def predict(layers: Any, world_size: int, update_freq: int, steps: int) -> float:
        asked.append((world_size, update_freq, steps))
        return 1.5

    assert kfac_notebook.predicted_traffic([found], predict) == [(3, 1.5, 3 * 46 / 7)]
    assert asked == [(2, 3, 7)]
    assert kfac_notebook.predicted_traffic([found], lambda *args: None) == []
    assert "TypeError" in capsys.readouterr().out


def test_notebook_26_says_which_end_of_kaisas_range_the_course_builds() -> None:
    """Claim 3 of issue 40: the course does not build "the design of KAISA and of kfac_pytorch". It
    builds one end of KAISA's range (every rank receives every decomposition, owners round robin);
    KAISA's contribution is the fraction of gradient workers, and kfac_pytorch assigns layers
    greedily by cost. The solution's owners are round robin, as the notebook says."""
    cells = json.loads((ROOT / "notebooks" / "26_kfac_distributed.ipynb").read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert "design you build here is the one of KAISA" not in text
    assert "of KAISA (Pauloski et al., SC'21) and of" not in text
    for said in ("one end of the range", "every rank receives every layer's decompositions", "round robin",
                 "grad_worker_fraction", "greedily by cost"):
        assert said in text, said
    assert "owner = i % world_size  # round robin" in (ROOT / "solutions" / "kfac.py").read_text()
    for learner_file in ("exercises/kfac.py", "solutions/kfac.py"):  # the files' own docstrings say it too
        said = " ".join((ROOT / learner_file).read_text().split())
        assert "the KAISA design of kfac_pytorch" not in said and "one end of the range of KAISA" in said, learner_file


def test_a_run_without_steps_or_with_a_problem_is_refused() -> None:
    empty = Run("K-FAC run", [], {1: ProcessTrace(1, [_event(0, "exit", call="init_process_group", world_size=2,
                                                               rank_joined=0), _event(1, "ddp")])})
    with pytest.raises(runtime.LaunchError, match="no optimizer step"):
        kfac_notebook._communication(empty, 1, 100)
    with pytest.raises(runtime.LaunchError, match="no trace"):
        kfac_notebook._communication(Run("K-FAC run", [], {}), 1, 100)


@pytest.mark.launch
def test_a_traced_kfac_run_communicates_only_at_refreshes(course: Path) -> None:
    """The solution on 2 processes, update_freq 3, traced by the checker: the MLP's six factors
    all-reduced and twelve broadcasts at steps 1, 4, 7, ... (counted from 1), nothing in between."""
    (found,) = kfac_notebook.communication((3,), script=optimizers.KFAC_SOLUTION)
    refreshes = [k for k, f in enumerate(found.factors) if f]
    assert refreshes == list(range(0, len(found.factors), 3)) and len(found.factors) >= 6
    assert all(found.factors[k] == MLP_FACTORS and found.broadcasts[k] == 12 for k in refreshes)
    assert all(found.broadcasts[k] == 0 and found.seconds[k] == 0 for k in range(len(found.factors)) if k not in refreshes)
    assert found.gradients == MLP_PARAMETERS
    # notebook 26's prediction (the solution of kfac_traffic) equals what the run communicated
    predict = runtime.exercise("solutions/kfac_traffic.py").kfac_floats_per_step
    ((k, predicted, measured),) = kfac_notebook.predicted_traffic([found], predict)
    assert k == 3 and predicted == pytest.approx(measured, rel=1e-12) and measured > 0


def test_kfac_cost_times_each_part_of_a_step(course: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Notebook 26's cost cell: three medians, a refresh costing more than preconditioning alone
    (it decomposes a 785 x 785 factor), and torch's thread count left as it was."""
    threads = torch.get_num_threads()
    found = kfac_notebook.kfac_cost(batch_size=64, repeats=2, script=optimizers.KFAC_SOLUTION)  # no check to run
    assert set(found) == {"forward and backward", "K-FAC, preconditioning only", "K-FAC, with a refresh"}
    assert found["K-FAC, with a refresh"] > found["K-FAC, preconditioning only"] > 0
    assert torch.get_num_threads() == threads
    assert "with a refresh" in capsys.readouterr().out
