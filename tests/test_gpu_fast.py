"""The cupy fast paths (`fcoll.gpu.fast`) and the per-group transport choice
(`fcoll.gpu.route.choose`): on a GPU, or on the CPU stand-in (``FCOLL_FAKE_CUPY=1``).

Fast paths: learned by the first call of an (op, dtype) on the default group over NCCL,
then taken by later calls, with the same results, call counts and errors as the whole
path; never under a deadline or debug checks. Choice: unset ``FCOLL_GPU_TRANSPORT``, a
group whose ranks share a GPU uses MPI (warning once, naming them); ``=nccl`` raises.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import fcoll as fc
from fcoll.gpu import fast
from tests.test_gpu import REASON, _local_size

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
DTYPES = [np.float32, np.float64, np.int64, np.uint8, np.float16, ml_dtypes.bfloat16]


@pytest.fixture
def cupy_nccl() -> Iterator[Any]:
    """cupy with NCCL; settings as the job started them (restored after)."""
    import cupy

    from fcoll.backends import nccl

    if not nccl.available():
        pytest.skip(f"no NCCL: {nccl.why_unavailable()}")
    yield cupy
    _settings_as_started()


def _settings_as_started() -> None:
    """No default deadline, debug off (``fc.init(timeout=None)`` keeps a deadline set before)."""
    from fcoll import runtime

    runtime._state.timeout = None
    fc.init(debug="off")
    runtime.changed()


@pytest.fixture
def one_gpu_per_rank(cupy_nccl: Any) -> Any:
    """NCCL on this rank's own GPU (the fast paths are NCCL's)."""
    if os.environ.get("FCOLL_GPU_TRANSPORT", "").strip().lower() == "mpi":
        pytest.skip("FCOLL_GPU_TRANSPORT=mpi: these are NCCL's fast paths")
    if _local_size() > cupy_nccl.cuda.runtime.getDeviceCount():
        pytest.skip("NCCL needs one GPU per rank; more ranks than GPUs on this node")
    import fcoll.gpu

    fcoll.gpu.use_local_device()
    return cupy_nccl


def _inputs(shape: tuple[int, ...], dtype: Any) -> list[np.ndarray]:
    """Every rank's input (small integers: sums exact in every dtype)."""
    n = fc.get_world_size()
    return [(np.arange(int(np.prod(shape))) % 7 + r).reshape(shape).astype(dtype) for r in range(n)]


# op -> (table, key for dtype, fcoll call, numpy reference from every rank's input)
Case = tuple[dict[Any, Any], Callable[[Any], Any], Callable[[Any], Any],
             Callable[[list[np.ndarray], int], np.ndarray]]


def _cases(n: int) -> dict[str, Case]:
    def acc(xs: list[np.ndarray]) -> np.ndarray:
        return np.sum(np.stack(xs).astype(np.float64), axis=0)

    return {
        "all_reduce": (fast.ALL_REDUCE, lambda d: ("sum", d), fc.all_reduce,
                       lambda xs, r: acc(xs).astype(xs[0].dtype)),
        "reduce_scatter_tensor": (fast.REDUCE_SCATTER, lambda d: ("sum", d), fc.reduce_scatter_tensor,
                                  lambda xs, r: np.split(acc(xs), n)[r].astype(xs[0].dtype)),
        "all_gather_into_tensor": (fast.ALL_GATHER, lambda d: d, fc.all_gather_into_tensor,
                                   lambda xs, r: np.concatenate(xs)),
        "all_to_all_single": (fast.ALL_TO_ALL, lambda d: d, fc.all_to_all_single,
                              lambda xs, r: np.concatenate([np.split(x, n)[r] for x in xs])),
        "broadcast": (fast.BROADCAST, lambda d: (0, d), fc.broadcast, lambda xs, r: xs[0]),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
                                "all_to_all_single", "broadcast"])
def test_fast_path_is_learned_then_taken_with_the_same_result(op: str, dtype: Any,
                                                               one_gpu_per_rank: Any) -> None:
    cp, n, r = one_gpu_per_rank, fc.get_world_size(), fc.get_rank()
    table, key, call, expected = _cases(n)[op]
    xs = _inputs((2 * n, 3), dtype)
    x = cp.asarray(xs[r])
    before = x.copy()
    first = call(x)
    assert key(np.dtype(dtype)) in table, f"{op} learned no fast path for {np.dtype(dtype)}"
    seq = fc.world().seq
    again = call(x)
    assert fc.world().seq == seq + 1  # the fast path counts its call, as the whole path does
    for y in (first, again):
        assert type(y) is cp.ndarray and y.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(cp.asnumpy(y), expected(xs, r))
    assert again.data.ptr != x.data.ptr  # a new array, the input untouched
    np.testing.assert_array_equal(cp.asnumpy(x), cp.asnumpy(before))


def test_fast_paths_fall_through_to_the_whole_path(one_gpu_per_rank: Any) -> None:
    """Cases a closure does not serve (non-contiguous, 0-d) give the whole path's result;
    bad shapes its error, not a wrong answer."""
    cp, n, r = one_gpu_per_rank, fc.get_world_size(), fc.get_rank()
    xs = _inputs((4 * n,), np.float32)
    x = cp.asarray(xs[r])
    fc.all_reduce(x), fc.all_gather_into_tensor(x), fc.reduce_scatter_tensor(x)  # learn
    fc.all_to_all_single(x)
    strided = x[::2]
    np.testing.assert_array_equal(cp.asnumpy(fc.all_reduce(strided)), sum(xs)[::2])
    np.testing.assert_array_equal(cp.asnumpy(fc.all_gather_into_tensor(strided)),
                                  np.concatenate([a[::2] for a in xs]))
    scalar = cp.asarray(np.float32(r))
    np.testing.assert_array_equal(cp.asnumpy(fc.all_gather_into_tensor(scalar)),
                                  np.arange(n, dtype=np.float32))
    if n > 1:
        odd = cp.asarray(np.ones(n + 1, np.float32))
        with pytest.raises(ValueError, match="divisible"):
            fc.reduce_scatter_tensor(odd)
        with pytest.raises(ValueError):
            fc.all_to_all_single(odd)


def test_no_fast_path_under_a_deadline_or_debug_checks(one_gpu_per_rank: Any) -> None:
    cp = one_gpu_per_rank
    x = cp.asarray(np.ones(4 * fc.get_world_size(), np.float32))
    for settings in ({"timeout": 60.0}, {"debug": "detail"}):
        fc.init(**settings)  # type: ignore[arg-type]
        fast.reset()
        for _ in range(2):
            y = fc.all_reduce(x)
            np.testing.assert_array_equal(cp.asnumpy(y), np.full(x.size, fc.get_world_size()))
        assert not fast.ALL_REDUCE, settings
        _settings_as_started()
        fc.all_reduce(x)
        assert fast.ALL_REDUCE, "the fast path comes back once the deadline and checks are off"


@pytest.fixture
def shared_gpu(cupy_nccl: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Every rank on GPU 0 (n >= 2, as on a one-GPU machine), in a group of its own
    (destroyed after), with ``FCOLL_GPU_TRANSPORT`` unset (auto)."""
    if fc.get_world_size() < 2:
        pytest.skip("needs two ranks on one GPU")
    from fcoll import dispatch

    monkeypatch.delenv("FCOLL_GPU_TRANSPORT", raising=False)
    dispatch.forget()
    group = fc.world().split(color=0)
    with cupy_nccl.cuda.Device(0):
        yield cupy_nccl, group
    group.destroy()
    monkeypatch.undo()
    dispatch.forget()


def test_auto_uses_mpi_where_ranks_share_a_gpu(shared_gpu: Any) -> None:
    cp, group = shared_gpu
    n = group.size
    x = cp.asarray(np.full(3, group.rank + 1, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fc.all_reduce(x, group=group)
        z = fc.all_gather_into_tensor(x, group=group)
    assert type(y) is cp.ndarray
    np.testing.assert_array_equal(cp.asnumpy(y), np.full(3, n * (n + 1) / 2))
    np.testing.assert_array_equal(cp.asnumpy(z), np.repeat(np.arange(1, n + 1), 3))
    assert group.gpu_shared == [list(range(n))] and group.nccl is None
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if group.rank == 0:
        ranks = " and ".join(map(str, range(n)))
        assert len(messages) == 1 and f"ranks {ranks} share a GPU" in messages[0], messages
    else:
        assert messages == []


def test_forced_nccl_refuses_ranks_that_share_a_gpu(shared_gpu: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cp, group = shared_gpu
    monkeypatch.setenv("FCOLL_GPU_TRANSPORT", "nccl")
    from fcoll import dispatch

    dispatch.forget()
    with pytest.raises(RuntimeError, match=r"expected one GPU per rank .*ranks 0 and 1"):
        fc.all_reduce(cp.asarray(np.ones(2, np.float32)), group=group)


def test_collectives_replay_from_a_cuda_graph(one_gpu_per_rank: Any) -> None:
    """A loop of mixed collectives captured once (cupy stream capture), replayed on new
    inputs written into the same array: every replay gives the new inputs' results."""
    cp, n, r = one_gpu_per_rank, fc.get_world_size(), fc.get_rank()
    if not hasattr(cp.cuda.Stream, "begin_capture"):
        pytest.skip("no CUDA graph capture (the CPU stand-in for cupy)")
    x = cp.zeros((2 * n, 3), np.float32)
    calls: dict[str, Callable[[], Any]] = {
        "sum": lambda: fc.all_reduce(x),
        "avg": lambda: fc.all_reduce(x, "avg"),
        "max": lambda: fc.all_reduce(x, "max"),
        "int16 sum": lambda: fc.all_reduce(x.astype(np.int16)),  # a cast: the whole path
        "gather": lambda: fc.all_gather_into_tensor(x),
        "scatter": lambda: fc.reduce_scatter_tensor(x),
        "a2a": lambda: fc.all_to_all_single(x),
        "bcast": lambda: fc.broadcast(x, src=n - 1),
    }
    for call in calls.values():
        call()  # the communicator and the fast paths exist before capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.synchronize()
        stream.begin_capture()
        results = [{name: call() for name, call in calls.items()} for _ in range(3)]
        graph = stream.end_capture()
    for trial in range(3):
        xs = [x_r + 10 * trial for x_r in _inputs((2 * n, 3), np.float32)]
        total = np.sum(xs, axis=0)
        expected = {
            "sum": total, "avg": total / n, "max": np.max(xs, axis=0),
            "int16 sum": total.astype(np.int16), "gather": np.concatenate(xs),
            "scatter": np.split(total, n)[r],
            "a2a": np.concatenate([np.split(a, n)[r] for a in xs]), "bcast": xs[n - 1],
        }
        with stream:
            x[...] = cp.asarray(xs[r])
            graph.launch(stream)
            stream.synchronize()
        for round_ in results:
            for name, y in round_.items():
                np.testing.assert_allclose(cp.asnumpy(y), expected[name], rtol=1e-6,
                                           err_msg=f"{name}, trial {trial}")
