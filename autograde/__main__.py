"""python -m autograde check [--step S ...] [--all] [--script PATH] [--json]

Runs the learner's script for real, with several processes, and says for each step of the
lab whether it is right, what was observed, and where to look when it is not. The exit
status is 0 exactly when every selected step passes (a step that cannot apply here, such
as SyncBatchNorm on a machine without GPUs, does not count against it).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from autograde.grading import api, registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde", description="Check the DDP Lab's steps.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check steps of the learner's script")
    check.add_argument("--step", action="extend", nargs="+", default=[], metavar="S",
                       help=f"steps to check, out of: {' '.join(registry.IDS)}")
    check.add_argument("--all", action="store_true", help="check every step (the default without --step)")
    check.add_argument("--script", help="the script to check (default: fashion_mnist.py here or in ..)")
    check.add_argument("--json", action="store_true", help="print the results as JSON")
    check.add_argument("--procs-per-node", type=int, default=2, help="processes per simulated node (default 2)")
    check.add_argument("--nodes", type=int, default=2, help="simulated nodes for Steps 3-9 (default 2)")
    check.add_argument("--fresh", action="store_true", help="run the script again even if its verdicts are known")
    args = parser.parse_args(argv)
    try:
        steps = None if args.all or not args.step else [api.normalise(s) for s in args.step]
        if args.procs_per_node < 1 or args.nodes < 1:
            raise ValueError("--procs-per-node and --nodes must be at least 1")
        results = api.check_steps(steps, args.script, procs_per_node=args.procs_per_node, nodes=args.nodes,
                                   fresh=args.fresh)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"error: {err}\n")
    if args.json:
        print(json.dumps([asdict(r) | {"status": r.status} for r in results], indent=2))
    else:
        print(api.report(results))
    return 0 if all(r.passed is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
