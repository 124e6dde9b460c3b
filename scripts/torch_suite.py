"""torch's own distributed test base (``DistributedTest._DistTestBase`` of torch's
``distributed_test.py``) on a backend, under ``mpiexec``: one MPI rank per torch rank.

torch runs these tests in processes it spawns per test; here every rank of one
``mpiexec -n N`` job runs the tests one after another, each between its own
``init_process_group`` (a fresh ``file://`` store) and ``destroy_process_group``, as torch's
``TestDistBackend._run`` does. The skip decorators are evaluated as for ``--as`` (gloo: the
tests that run on gloo on CPU); the tests' bodies see ``BACKEND`` as the backend under test
(``--backend``), so ``test_backend_full_group`` and the barrier-timeout tests, which
re-initialise with it, run on it. A test is a pass when it passes on every rank, a skip
when it skips on every rank (``unittest.SkipTest``, a skip mark, or torch's skip exit
codes); anything else is a failure, with each rank's message. Rank 0 prints one line per
test and writes the results as JSON (``--out``). A test that runs past ``--test-timeout``
seconds ends the job with every rank's stack (faulthandler).

Example:
    mpiexec -n 2 .venv/bin/python scripts/torch_suite.py --backend fcoll --out r.json
    mpiexec -n 2 .venv/bin/python scripts/torch_suite.py --backend gloo -k allreduce
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import unittest
from datetime import timedelta
from typing import Any

from mpi4py import MPI

# Tests whose bodies take their CPU path only when BACKEND names gloo or mpi (torch's
# _test_accumulate_gradients_no_sync: ``if BACKEND == "mpi" or BACKEND == "gloo"``): they
# see BACKEND as gloo, and their collectives still run on the default group, which is the
# backend under test.
CPU_BY_NAME = ("test_accumulate_gradients_no_sync",)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="fcoll", help="the backend under test")
    p.add_argument("--as", dest="as_", default="gloo",
                   help="the backend whose skips apply (gloo: the CPU tests)")
    p.add_argument("-k", dest="keyword", default="", help="only tests whose name has this")
    p.add_argument("--tests", default="", help="a file of test names, one per line")
    p.add_argument("--out", default="", help="the JSON results (rank 0)")
    p.add_argument("--expect", default="",
                   help="JSON of the tests that must pass per world size (tests/torch_suite_gloo.json)")
    p.add_argument("--test-timeout", type=float, default=300.0)
    return p.parse_args()


def _shared_dir(comm: Any) -> str:
    """A temporary folder made by rank 0 for the tests' file barrier and stores."""
    path = tempfile.mkdtemp(prefix="torch-suite-") if comm.rank == 0 else None
    return str(comm.bcast(path))


def _environment(args: argparse.Namespace, comm: Any, root: str) -> None:
    """The variables torch's test module reads when it is imported."""
    os.environ["BACKEND"] = args.as_
    os.environ["WORLD_SIZE"] = str(comm.size)
    os.environ["TEMP_DIR"] = root
    os.environ["INIT_METHOD"] = "file://" + os.path.join(root, "init_dir", "shared_init_file")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
    os.environ.setdefault("TORCH_DISABLE_ADDR2LINE", "1")  # symbolizing takes seconds
    if comm.rank == 0:
        for sub in ("barrier", "test_dir", "init_dir"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
    comm.Barrier()


def _skip_reason(case: Any, name: str) -> str | None:
    """The reason a skip mark on the test (or its class) gives, or None."""
    method = getattr(case, name)
    for holder in (method, type(case)):
        if getattr(holder, "__unittest_skip__", False):
            return str(getattr(holder, "__unittest_skip_why__", "skipped"))
    return None


def _run_one(case: Any, name: str, skip_codes: set[int]) -> tuple[str, str]:
    """('pass' | 'skip' | 'fail', detail) of one test on this rank."""
    reason = _skip_reason(case, name)
    if reason is not None:
        return "skip", reason
    try:
        getattr(case, name)()
    except unittest.SkipTest as e:
        return "skip", str(e)
    except SystemExit as e:  # torch's skip decorators exit the spawned process
        code = e.code if isinstance(e.code, int) else 1
        if code in skip_codes:
            return "skip", f"exit code {code}"
        return "fail", f"SystemExit({e.code})"
    except BaseException:
        return "fail", traceback.format_exc(limit=8)
    return "pass", ""


def _verdict(results: list[tuple[str, str]]) -> tuple[str, str]:
    kinds = {k for k, _ in results}
    if kinds == {"pass"}:
        return "pass", ""
    if kinds == {"skip"}:
        return "skip", results[0][1]
    # a skip on some ranks and a pass on others is a pass where the test itself says so
    # (tests that skip the body off the subgroup still count as run on its members)
    if kinds == {"pass", "skip"}:
        return "pass", ""
    fails = [f"rank {r}: {d.strip()}" for r, (k, d) in enumerate(results) if k == "fail"]
    return "fail", "\n".join(fails)


def main() -> int:
    args = _args()
    comm = MPI.COMM_WORLD
    root = _shared_dir(comm)
    _environment(args, comm, root)

    import torch.distributed as dist

    # torch's test modules are untyped: Any here
    common_utils: Any = importlib.import_module("torch.testing._internal.common_utils")
    skips: Any = importlib.import_module("torch.testing._internal.common_distributed").TEST_SKIPS
    dt: Any = importlib.import_module("torch.testing._internal.distributed.distributed_test")

    if args.backend == "fcoll":
        import fcoll.torch  # noqa: F401  (registers the backend)
    dt.BACKEND = args.backend  # the bodies run on the backend under test

    class Case(dt.DistributedTest._DistTestBase, common_utils.TestCase):  # type: ignore[misc]
        rank: int = comm.rank
        file_name: str = ""

        @property
        def world_size(self) -> str:
            return str(os.environ["WORLD_SIZE"])

        @property
        def init_method(self) -> str:
            return "file://" + self.file_name

        def runTest(self) -> None:  # unittest wants a method to construct the case
            pass

    names = sorted(n for n in dir(dt.DistributedTest._DistTestBase) if n.startswith("test_"))
    if args.tests:
        with open(args.tests) as f:
            wanted = {line.strip() for line in f if line.strip() and not line.startswith("#")}
        names = [n for n in names if n in wanted]
    if args.keyword:
        names = [n for n in names if args.keyword in n]
    skip_codes = {s.exit_code for s in skips.values()}
    results: dict[str, dict[str, Any]] = {}
    started = time.time()
    for i, name in enumerate(names):
        case = Case()
        case.file_name = os.path.join(root, f"store-{i}")
        dt.Barrier.barrier_id = 0
        comm.Barrier()
        if comm.rank == 0:
            for f_name in os.listdir(os.path.join(root, "barrier")):
                os.unlink(os.path.join(root, "barrier", f_name))
        comm.Barrier()
        faulthandler.dump_traceback_later(args.test_timeout, exit=True)
        t0 = time.time()
        reason = _skip_reason(case, name)
        if reason is not None:
            mine = ("skip", reason)
        else:
            seconds = dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout)
            dist.init_process_group(init_method=case.init_method, backend=args.backend,
                                    world_size=comm.size, rank=comm.rank,
                                    timeout=timedelta(seconds=seconds))
            case._barrier()
            common_utils.set_rng_seed()
            if name.startswith(CPU_BY_NAME):
                dt.BACKEND = args.as_
            mine = _run_one(case, name, skip_codes)
            dt.BACKEND = args.backend
            if dist.is_initialized():
                with contextlib.suppress(RuntimeError):
                    case._barrier()
                dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()
        every = comm.gather(mine)
        if comm.rank == 0:
            assert every is not None
            kind, detail = _verdict(every)
            results[name] = {"result": kind, "seconds": round(time.time() - t0, 2),
                             "detail": detail}
            print(f"{kind:4} {time.time() - t0:6.1f}s {name}"
                  + (f"\n{detail}" if kind == "fail" else ""), flush=True)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
        count = {k: sum(r["result"] == k for r in results.values()) for k in ("pass", "skip", "fail")}
        print(f"{args.backend} at n = {comm.size}: {count['pass']} passed, {count['skip']} skipped, "
              f"{count['fail']} failed in {time.time() - started:.0f} s", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"backend": args.backend, "size": comm.size, "tests": results}, f,
                          indent=1, sort_keys=True)
        missing = _missing(args.expect, comm.size, results) if args.expect else []
        if missing:
            print(f"{len(missing)} tests that pass on gloo at n = {comm.size} did not pass: "
                  + ", ".join(missing), flush=True)
        return 1 if count["fail"] or missing else 0
    return 0


def _missing(path: str, size: int, results: dict[str, dict[str, Any]]) -> list[str]:
    """The tests ``path`` lists as passing at ``size`` that did not pass here (run or not)."""
    with open(path) as f:
        expected = json.load(f)["pass"].get(str(size), [])
    return [name for name in expected if results.get(name, {}).get("result") != "pass"]


if __name__ == "__main__":
    sys.exit(main())
