"""The header of a point-to-point message, so a receiver needs no template: int64 words
``[kind, dtype index, ndim, *shape]`` padded to an even count (16 bytes), then, for a
small array, its data (`fcoll.collectives.p2p`, `fcoll.collectives.neighbors`).

``kind`` says whether the data follows in the same message (`INLINE`) or in a second one
(`SEPARATE`), or-ed with flags of what the sender's array was (`fcoll.collectives.p2p`).

Example:
    >>> kind, dtype, shape, offset = parse(np.frombuffer(header(np.ones((2, 3)), INLINE), np.uint8))
    >>> kind, dtype, shape, offset
    (1, dtype('float64'), (2, 3), 48)
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from fcoll.policy.dtypes import SUPPORTED

INLINE, SEPARATE = 1, 2
DTYPES = sorted(SUPPORTED, key=str)
DTYPE_INDEX = {d: i for i, d in enumerate(DTYPES)}


def _format(ndim: int) -> struct.Struct:
    """int64 words ``kind, dtype index, ndim, *shape`` padded to an even count (16 bytes)."""
    return struct.Struct(f"<{3 + ndim + (ndim + 1) % 2}q")


FORMATS = [_format(ndim) for ndim in range(65)]
PREFIX = struct.Struct("<3q")
MAX_BYTES = FORMATS[64].size  # the longest header (64 dimensions)


def header(x: Any, kind: int) -> bytes:
    """The header of array ``x`` (anything with ``ndim``, ``shape``, ``dtype``)."""
    pad = (0,) * (x.ndim + 1 & 1)
    return FORMATS[int(x.ndim)].pack(kind, DTYPE_INDEX[x.dtype], x.ndim, *x.shape, *pad)


def parse(buf: np.ndarray) -> tuple[int, np.dtype[Any], tuple[int, ...], int]:
    """``(kind, dtype, shape, data offset)`` of a received header."""
    kind, index, ndim = PREFIX.unpack_from(buf, 0)  # type: ignore[arg-type]  # a buffer
    fmt = FORMATS[ndim]
    shape = fmt.unpack_from(buf, 0)[3 : 3 + ndim]
    return kind, DTYPES[index], shape, fmt.size


def inline(buf: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...], offset: int) -> np.ndarray:
    """The data that came inside the header's message, as a view of ``buf``."""
    return np.ndarray(shape, dtype, buffer=buf, offset=offset)
