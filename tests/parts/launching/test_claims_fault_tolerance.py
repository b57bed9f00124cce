"""Notebook 15's claim that a resume must give each rank back its own generator state, run for
real: the solution's save_checkpoint and load_checkpoint, and the notebook's third hints (save
and resume) made into the same two functions, under torchrun with 2 gloo processes whose
generators differ (as dropout's masks and augmentations make them). After a resume, every rank
draws the dropout mask the uninterrupted run drew, and the two ranks draw different ones. The
hint as it was (rank 0's state restored on every rank) is run too, and fails."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, again_on_gloo_fault

from autograde.engine import processes

pytestmark = pytest.mark.timeout(240)

NOTEBOOK = ROOT / "notebooks" / "15_fault_tolerance.ipynb"

# The hint that notebook 15 gave before (issue 40, claim 4): rank 0 saved its own state, and every
# rank restored it.
RANK_ZERO_HINT = '''
def save_checkpoint(path, model, optimizer, epoch):
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "rng": torch.get_rng_state()}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


def load_checkpoint(path, model, optimizer, device):
    if not os.path.exists(path):
        return 1
    checkpoint = torch.load(path, map_location=device)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["rng"].cpu())
    return checkpoint["epoch"] + 1
'''

# Each process: for each file of functions, an uninterrupted epoch 1 and a save ("straight"), then
# epoch 2; or ("resume", in fresh processes) a load and epoch 2. An "epoch" draws one dropout mask.
DRIVER = '''
import datetime, importlib.util, json, os, sys
import torch
import torch.distributed as dist
import torch.nn as nn

phase, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
masks = {}
for k, file in enumerate(files):
    spec = importlib.util.spec_from_file_location(f"functions_{k}", file)
    functions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(functions)
    torch.manual_seed(0)  # the same weights everywhere, as the course's script
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(100 + rank)  # each rank's generator its own, as a per-rank seed or augmentation makes it
    path = os.path.join(out, f"checkpoint-{k}.pt")
    start = functions.load_checkpoint(path, model, optimizer, torch.device("cpu"))
    dist.barrier()  # nobody saves before every rank has loaded (or found nothing)
    assert start == (2 if phase == "resume" else 1), start
    for epoch in range(start, 3):
        mask = (model.module[1](torch.ones(64)) > 0).int().tolist()  # this epoch's dropout draw
        if epoch == 1:
            functions.save_checkpoint(path, model, optimizer, epoch)
    masks[file] = mask  # epoch 2's
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump(masks, f)
dist.destroy_process_group()
'''


def _hint_functions() -> str:
    """The notebook's third hints for `# TODO checkpoint` and `# TODO resume`, as the two functions."""
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "markdown"]
    bodies = {}
    for todo in ("checkpoint", "resume"):
        text = next(c for c in cells if c.startswith(f"**Hints for `# TODO {todo}`**"))
        hint = text[text.index("Hint 3"):]
        bodies[todo] = textwrap.indent(re.findall(r"```python\n(.*?)```", hint, re.S)[0], "    ")
    return (f"def save_checkpoint(path, model, optimizer, epoch):\n{bodies['checkpoint']}\n\n"
            f"def load_checkpoint(path, model, optimizer, device):\n{bodies['resume']}")


def _module(path: Path, functions: str) -> str:
    path.write_text("import os\n\nimport torch\nimport torch.distributed as dist\n\n" + functions)
    return str(path)


@pytest.mark.launch
def test_a_resume_gives_every_rank_its_own_dropout_masks(tmp_path: Path) -> None:
    files = {"the solution": str(ROOT / "solutions" / "resume_training.py"),
             "notebook 15's hints": _module(tmp_path / "hints.py", _hint_functions()),
             "rank 0's state on every rank": _module(tmp_path / "rank_zero.py", RANK_ZERO_HINT)}
    driver, out = tmp_path / "driver.py", tmp_path / "out"
    driver.write_text(DRIVER)
    out.mkdir()
    for phase in ("straight", "resume"):  # the resume in new processes, as torchrun's restart
        command = [processes.PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", driver,
                   phase, out, *files.values()]
        result = again_on_gloo_fault(lambda: processes.run(command, timeout=180, env={"CUDA_VISIBLE_DEVICES": ""}),
                                     [out] if phase == "straight" else [])  # a resume made again finds the checkpoints
        assert result.returncode == 0, result.output[-3000:]
    masks = {(phase, rank): json.loads((out / f"{phase}-{rank}.json").read_text())
             for phase in ("straight", "resume") for rank in (0, 1)}
    for name, file in files.items():
        straight = [masks["straight", r][file] for r in (0, 1)]
        resumed = [masks["resume", r][file] for r in (0, 1)]
        assert straight[0] != straight[1], f"{name}: the ranks drew the same masks without a resume"
        if name == "rank 0's state on every rank":  # the claim the notebook made: it gives rank 1 rank 0's masks
            assert resumed[1] == resumed[0] and resumed[1] != straight[1], name
        else:
            assert resumed == straight, f"{name}: a rank's masks after the resume differ from the uninterrupted run's"
