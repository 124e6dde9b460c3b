"""The fast path of `fcoll.sendrecv` with ``like=`` (`fcoll.collectives._bare`'s exchange):
numpy arrays on the default group or a `Group` passed as such, learned after the first such
call as the collectives' fast paths are (`fcoll.collectives._fast`: table ``SENDRECV_LIKE``,
dropped by ``reset``). A later call checks in a few lines what the full path would, posts one
``MPI_Sendrecv`` into a new array of ``like``'s shape and dtype, and checks the size that
arrived; anything else (another peer or tag type, a layout or dtype the full path would
copy or refuse) returns None and takes the full path, which raises the documented errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fcoll.collectives._bare import mismatch
from fcoll.collectives.p2p import BARE, BYTE, MPI, PARTS
from fcoll.diagnostics import mpi_errors
from fcoll.policy.dtypes import SUPPORTED

SendrecvLike = Callable[[np.ndarray, Any, Any, Any, np.ndarray], "np.ndarray | None"]


def sendrecv_like(g: Any) -> SendrecvLike:
    """``fast(x, dst, src, tag, like)`` for group ``g``: the received array, or None where the
    call is not the common one (``dst``/``src`` group ranks as ints, ``tag`` in 0..1023, ``x``
    C-contiguous, both dtypes supported); a message of another size raises `ValueError`.

    Example:
        >>> fast = sendrecv_like(fc.world())                 # on a ring of 2 ranks
        >>> fast(np.ones(2), 1, 1, 0, np.empty(2))           # what rank 1 sent
        array([1., 1.])
    """
    sendrecv, n, status, empty = g._comm.Sendrecv, g.size, MPI.Status(), np.empty
    tolerate, truncated, supported = mpi_errors.TOLERATE, mpi_errors.TRUNCATED, SUPPORTED

    def run(x: np.ndarray, dst: Any, src: Any, tag: Any, like: np.ndarray) -> np.ndarray | None:
        if type(dst) is not int or type(src) is not int or type(tag) is not int \
                or not (0 <= dst < n and 0 <= src < n and 0 <= tag < 1024) \
                or x.dtype not in supported or like.dtype not in supported \
                or (x.ndim > 1 and not x.flags.c_contiguous):  # 1-D strided: BufferError below
            return None
        out = empty(like.shape, like.dtype)
        wire, before = PARTS * tag + BARE, truncated[0]
        tolerate[0] += 1
        try:
            sendrecv([x, BYTE], dst, wire, [out, BYTE], src, wire, status)
        except BufferError:  # a strided 1-D x: mpi4py takes contiguous buffers; nothing sent
            return None
        except MPI.Exception as error:  # FCOLL_ABORT_ON_ERROR=0: mpi4py's handler
            if error.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            truncated[0] += 1
        finally:
            tolerate[0] -= 1
        if truncated[0] != before or status.Get_count(BYTE) != out.nbytes:
            mismatch("sendrecv", out, status, truncated[0] != before, src)
        return out

    return run
