"""fcoll's command line (``python -m fcoll``): `info` (`fcoll.cli.info`) and `check` (the
job launcher `fcoll.cli.check_job`, running the cases of `fcoll.cli.check_cases`).

    python -m fcoll info [--json]          versions, MPI library, thread level, knobs, GPU
    python -m fcoll check [-n 2] [--timeout 120] [--array numpy|cupy|all]
                                           run every collective in a small job and verify it
                                           (on numpy arrays, cupy arrays, or both)
    python -m fcoll check --gpu [-n 2]     each route a cupy buffer can take here (NCCL,
                                           CUDA-aware MPI, staged), tried; the route of every
                                           collective, why, and what would make it faster
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _parser() -> argparse.ArgumentParser:
    from fcoll.cli.check_job import ARRAY_CHOICES

    parser = argparse.ArgumentParser(prog="python -m fcoll", description="fcoll's command line")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="show versions, the MPI library and settings")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    check = commands.add_parser("check", help="run every collective on a small job and verify it")
    check.add_argument("-n", type=int, default=2, help="number of ranks (default 2)")
    check.add_argument("--timeout", type=float, default=120.0,
                       help="seconds before the whole job counts as hung (default 120)")
    check.add_argument("--only", action="append", metavar="NAME", help="run only this check")
    check.add_argument("--array", choices=ARRAY_CHOICES, default="numpy",
                       help="run the checks on numpy arrays (default), cupy arrays (fails "
                            "without a GPU), or all: numpy, then cupy where a GPU is usable")
    check.add_argument("--gpu", action="store_true",
                       help="on cupy arrays: try each route (NCCL, CUDA-aware MPI, staged), show "
                            "which one each collective takes here and why, and the setting that "
                            "would make it faster")
    check.add_argument("--inject-failure", metavar="NAME", help=argparse.SUPPRESS)
    return parser


def _info(as_json: bool) -> int:
    from fcoll.cli.info import collect, render_plain, render_rich
    from fcoll.runtime import mpi

    report = collect()
    if mpi().COMM_WORLD.Get_rank() != 0:
        return 0
    if as_json:
        print(json.dumps(report, indent=2))
    elif sys.stdout.isatty():
        try:
            render_rich(report)
        except ImportError:
            print(render_plain(report))
    else:
        print(render_plain(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process's exit code."""
    args = _parser().parse_args(argv)
    if args.command == "info":
        try:
            return _info(args.json)
        except BrokenPipeError:  # `python -m fcoll info | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    from fcoll.cli.check_cases import CHECKS
    from fcoll.cli.check_job import launch

    unknown = [name for name in [*(args.only or []), args.inject_failure] if name and name not in CHECKS]
    if unknown:
        print(f"check: expected check names from {list(CHECKS)}, got {unknown}", file=sys.stderr)
        return 2
    extra = [arg for name in args.only or [] for arg in ("--only", name)]
    if args.inject_failure:
        extra += ["--inject-failure", args.inject_failure]
    if args.array != "numpy":
        extra += ["--array", args.array]
    if args.gpu and (args.only or args.inject_failure or args.array != "numpy"):
        print("check: expected --gpu alone (it runs its own calls), got it with --only, --array "
              "or --inject-failure", file=sys.stderr)
        return 2
    return launch(args.n, args.timeout, ["--gpu"] if args.gpu else extra)

