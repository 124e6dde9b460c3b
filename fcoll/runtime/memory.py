"""Keep freed pages in the process so that returning fresh arrays stays cheap.

Every fcoll collective returns a new array. With glibc's defaults each large array is a
fresh ``mmap`` that the kernel zero-fills page by page, which cost up to 3x raw MPI at
1-64 MiB here (``docs/performance.md``). Raising the trim threshold and serving large
blocks from the heap lets ``free`` + ``malloc`` reuse warm pages, which brought the ratio
back to about 1.0. The cost: memory freed by the program stays mapped in the process
instead of going back to the kernel. Set ``FCOLL_MALLOC_TUNING=0`` to leave glibc alone.
It is a process setting, not an MPI one: ``fcoll.runtime.mpi`` applies it the first time
fcoll needs MPI, also when the program started MPI first (``from mpi4py import MPI``
before ``import fcoll``). `tuned` says whether it is in effect.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MAX_MMAP_THRESHOLD = 32 << 20  # glibc's upper bound on 64-bit systems
_TRIM_THRESHOLD = 1 << 30

_done = False


def keep_freed_pages() -> bool:
    """Tune glibc's malloc once; return whether it was tuned (False off glibc or opted out)."""
    global _done
    if _done:
        return True
    if os.environ.get("FCOLL_MALLOC_TUNING", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok = all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, _MAX_MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
            (_M_MMAP_MAX, 0),
        )
    )
    _done = ok
    return ok


def tuned() -> bool:
    """Whether this process's malloc is tuned (by `keep_freed_pages`, whoever started MPI).

    Example:
        >>> import fcoll; from fcoll.runtime import memory
        >>> memory.tuned()            # on glibc, unless FCOLL_MALLOC_TUNING=0
        True
    """
    return _done


def status() -> str:
    """`tuned` in words, with the reason when it is not, for ``python -m fcoll info``."""
    if _done:
        return "applied (freed pages stay in the process)"
    if os.environ.get("FCOLL_MALLOC_TUNING", "1") == "0":
        return "off (FCOLL_MALLOC_TUNING=0)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not applied (not glibc)"
    return "not applied (fcoll has not started yet, or mallopt failed)"
