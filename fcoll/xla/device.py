"""fcoll's handler on a GPU: XLA's device buffers as cupy arrays, worked on in XLA's stream.

The handler asks XLA for the stream the call runs on (``XLA_FFI_Stream_Get``) and makes it
cupy's current stream (``cupy.cuda.ExternalStream``) while fcoll's cupy path runs
(`fcoll.xla.semantics` with cupy: NCCL, or MPI, as for eager cupy arrays), so the collective and
the copies into XLA's output buffers are queued behind the work XLA already issued, without
a host synchronisation on the NCCL path. cupy has no bfloat16: such buffers raise
`TypeError`. Not yet run on a GPU by the test suite (docs/jax.md says so).

Example:
    >>> serve(frame, "psum", g, {"op": "sum"})      # from fcoll.xla.handler, on XLA's thread
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes

from fcoll.groups.group import Group
from fcoll.xla import capi, semantics


def _array(buf: capi.Buffer, cupy: Any) -> Any:
    """The XLA device buffer ``buf`` as a cupy array over its memory (no copy)."""
    dtype = capi.DTYPES[buf.dtype]
    if dtype == ml_dtypes.bfloat16:
        raise TypeError("fcoll.lax inside jit on a GPU: expected a dtype cupy has, got bfloat16")
    shape = tuple(buf.dims[: buf.rank]) if buf.rank else ()
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return cupy.empty(shape, dtype)
    memory = cupy.cuda.UnownedMemory(buf.data, nbytes, None)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


def serve(frame: capi.CallFrame, kind: str, g: Group, params: dict[str, Any]) -> None:
    """Run the collective ``kind`` on the call's device buffers, in XLA's stream."""
    import cupy

    with cupy.cuda.ExternalStream(capi.stream(frame)):
        ins = [_array(b, cupy) for b in capi.buffers(frame.args)]
        outs = [_array(b, cupy) for b in capi.buffers(frame.rets)]
        got = semantics.run(kind, ins, g, cupy, params)
        for out, y in zip(outs, got, strict=True):
            out[...] = y.reshape(out.shape)
