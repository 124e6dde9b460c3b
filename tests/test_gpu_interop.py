"""torch CUDA tensors through DLPack and the GPU path (NCCL, CUDA-aware or staged MPI): the
result is a tensor, equal to the numpy call's. On a GPU machine with torch's CUDA build the
tensors are real CUDA tensors, and results must be on the input's device; on the CPU
stand-in for cupy (``FCOLL_FAKE_CUPY=1``) a CPU tensor that reports a CUDA device takes the
same route (DLPack into the stand-in's arrays, its NCCL or MPI, DLPack back), so CI runs the
wiring; the devices themselves are checked only on a GPU (scripts/gpu-check.sh).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

import fcoll as fc
from tests.conftest import G
from tests.helpers import data
from tests.test_gpu import REASON
from tests.test_gpu_stack import _cupy, _fake, device, transport  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON)),
              pytest.mark.usefixtures("transport")]  # each test on NCCL, aware and staged MPI


@cache
def _fake_cuda_type() -> type:
    import torch

    class CudaTensor(torch.Tensor):
        """A CPU tensor that says it lives on CUDA device 0 (the stand-in's only device)."""

        @property
        def device(self) -> Any:  # type: ignore[override]
            return torch.device("cuda", 0)

    return CudaTensor


def cuda_tensor(a: np.ndarray) -> Any:
    torch = pytest.importorskip("torch")
    if _fake():
        return torch.from_numpy(a.copy()).as_subclass(_fake_cuda_type())
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch.from_numpy(a.copy()).to(f"cuda:{_cupy().cuda.Device().id}")


def host(y: Any) -> np.ndarray:
    import torch

    assert isinstance(y, torch.Tensor), type(y)
    if not _fake():
        assert y.device.type == "cuda" and y.device.index == _cupy().cuda.Device().id, y.device
    return np.asarray(y.detach().cpu().numpy())


@pytest.fixture(autouse=True)
def dlpack_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the tensors that went into cupy through DLPack (on the stand-in, a fake CUDA
    tensor is exported as the CPU tensor it is: torch's ``__dlpack__`` asks its device)."""
    cupy, calls = _cupy(), []
    real = cupy.from_dlpack

    def counted(t: Any) -> Any:
        calls.append(1)
        if _fake() and isinstance(t, _fake_cuda_type()):
            import torch

            t = t.as_subclass(torch.Tensor)
        return real(t)

    monkeypatch.setattr(cupy, "from_dlpack", counted)
    return calls


CALLS = {
    "all_reduce": lambda x, g: fc.all_reduce(x, "sum", g.arg),
    "all_gather_into_tensor": lambda x, g: fc.all_gather_into_tensor(x, group=g.arg),
    "reduce_scatter_tensor": lambda x, g: fc.reduce_scatter_tensor(x, "avg", group=g.arg),
    "broadcast": lambda x, g: fc.broadcast(x, g.size - 1, g.arg),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_cuda_tensors_through_the_gpu_path(group: G, name: str, dlpack_calls: list[int]) -> None:
    mine = data(group.rank, (2 * group.size, 3), np.float32, 71)
    x = cuda_tensor(mine)
    got = host(CALLS[name](x, group))
    np.testing.assert_array_equal(got, CALLS[name](mine, group))
    np.testing.assert_array_equal(host(x), mine)  # the input is untouched
    assert dlpack_calls, "the tensor did not go through DLPack into cupy"


def test_cuda_tensors_in_lists_p2p_and_dp(group: G) -> None:
    n, r = group.size, group.rank
    mine = data(r, (3,), np.float32, 72)
    gathered = fc.all_gather(cuda_tensor(mine), group.arg)
    for i, y in enumerate(gathered):
        np.testing.assert_array_equal(host(y), data(i, (3,), np.float32, 72))
    sent = fc.isend(cuda_tensor(mine), (r + 1) % n, group.arg)
    got = fc.irecv((r - 1) % n, group.arg).wait()
    sent.wait()
    np.testing.assert_array_equal(host(got), data((r - 1) % n, (3,), np.float32, 72))
    grads = {"w": cuda_tensor(mine)}
    np.testing.assert_array_equal(host(fc.dp.average_gradients(grads, group.arg)["w"]),
                                  fc.dp.average_gradients({"w": mine}, group.arg)["w"])
