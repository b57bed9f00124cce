"""`make run`: the finished solution on every local GPU, or on 2 CPU processes.

It trains on Fashion-MNIST when the real data set is in --data-dir. Otherwise it writes
the synthetic stand-in (once) and says so in a banner, so that nobody mistakes its
numbers for Fashion-MNIST results. Arguments after `--` go to the training script.

    python -m autograde.tools.run [--data-dir data] [-- --epochs 3 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograde import data, settings
from autograde.engine import processes

ROOT, SOLUTION = settings.REPO, settings.SOLUTION
BANNER = """\
{rule}
  SYNTHETIC STAND-IN DATA: there is no Fashion-MNIST in {real}/ (`make data` fetches it).
  Training on the generated stand-in in {fake}/ instead.
  The numbers below are NOT Fashion-MNIST results.
{rule}"""


def command(data_dir: Path, num_gpus: int, on_gpu: bool, extra: list[str]) -> list[str]:
    """The solution's command line; on the CPU the small model (--widen-factor 1) unless asked otherwise."""
    cmd = [sys.executable, str(SOLUTION), "--num-gpus", str(num_gpus), "--data-dir", str(data_dir)]
    if not on_gpu and not any(a.startswith("--widen-factor") for a in extra):
        cmd += ["--widen-factor", "1"]
    return cmd + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.tools.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="where the real data set is (or goes)")
    parser.add_argument("--synthetic-dir", type=Path, default=Path("data/synthetic"), help="where the stand-in goes")
    parser.add_argument("--synthetic-size", type=int, nargs=2, default=(60000, 10000), metavar=("TRAIN", "VAL"),
                        help="images in the stand-in, if it has to be written")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then arguments for the training script")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra

    import torch  # slow to import: only once the arguments are known to be fine

    on_gpu = torch.cuda.is_available()
    num_gpus = torch.cuda.device_count() if on_gpu else 2
    data_dir, synthetic = data.choose(args.data_dir, args.synthetic_dir, *args.synthetic_size)
    if synthetic:
        print(BANNER.format(rule="=" * 88, real=args.data_dir, fake=data_dir), flush=True)
    where = f"{num_gpus} GPU(s)" if on_gpu else f"{num_gpus} CPU processes (no GPU here)"
    print(f"make run: the finished solution on {where}", flush=True)
    return processes.run_in_terminal(command(data_dir, num_gpus, on_gpu, extra))


if __name__ == "__main__":
    sys.exit(main())
