"""The part of XLA's FFI C API (``xla/ffi/api/c_api.h``, shipped in jaxlib) that fcoll's
handler uses, in ctypes: the call frame, its buffers and attributes, the metadata query and
errors. No compiler is needed: the handler is a Python function behind a C pointer.

The layouts follow the header of the installed jaxlib (FFI API 0.x: every struct starts
with its size and an extension pointer); `api_version` reads the version the handler
declares from that header, as a compiled handler would take it from its build.

Example:
    >>> frame = ctypes.cast(pointer, ctypes.POINTER(CallFrame)).contents
    >>> [a.shape for a in arrays(frame.args)]          # the operands as numpy views
    [(2, 3)]
"""

from __future__ import annotations

import ctypes
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

METADATA = 1  # XLA_FFI_Extension_Metadata
EXECUTE = 3  # XLA_FFI_ExecutionStage_EXECUTE
TOKEN = 17  # XLA_FFI_DataType_TOKEN
STRING = 4  # XLA_FFI_AttrType_STRING
INVALID_ARGUMENT, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL = 3, 4, 12, 13

# XLA_FFI_DataType -> numpy
DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(bool), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
    5: np.dtype(np.int64), 6: np.dtype(np.uint8), 7: np.dtype(np.uint16), 8: np.dtype(np.uint32),
    9: np.dtype(np.uint64), 10: np.dtype(np.float16), 11: np.dtype(np.float32),
    12: np.dtype(np.float64), 16: np.dtype(ml_dtypes.bfloat16), 15: np.dtype(np.complex64),
    18: np.dtype(np.complex128),
}


class ExtensionBase(ctypes.Structure):
    pass


ExtensionBase._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                          ("next", ctypes.POINTER(ExtensionBase))]


class ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", ApiVersion),
                ("traits", ctypes.c_uint32)]


class MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", ExtensionBase), ("metadata", ctypes.POINTER(Metadata))]


class Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class Args(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets have the same layout
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("args", ctypes.POINTER(ctypes.c_void_p))]


class ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("names", ctypes.POINTER(ctypes.POINTER(ByteSpan))),
                ("attrs", ctypes.POINTER(ctypes.c_void_p))]


class ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


ErrorCreate = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ErrorCreateArgs))


class StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


StreamGet = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(StreamGetArgs))


class Api(ctypes.Structure):  # the functions fcoll calls, then the rest as pointers
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api_version", ApiVersion), ("internal_api", ctypes.c_void_p),
                ("error_create", ErrorCreate), ("error_get_message", ctypes.c_void_p),
                ("error_destroy", ctypes.c_void_p), ("handler_register", ctypes.c_void_p),
                ("stream_get", StreamGet)]


class CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("extension_start", ctypes.POINTER(ExtensionBase)),
                ("api", ctypes.POINTER(Api)), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", Args), ("rets", Args), ("attrs", Attrs), ("future", ctypes.c_void_p)]


HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(CallFrame))


@cache
def api_version() -> tuple[int, int]:
    """The FFI API version of the installed jaxlib's ``c_api.h`` (0.1 if it cannot be read)."""
    import jax

    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    try:
        text = header.read_text()
    except OSError:
        return 0, 1
    found = [re.search(rf"#define XLA_FFI_API_{part}\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    return (int(found[0].group(1)), int(found[1].group(1))) if all(found) else (0, 1)  # type: ignore[union-attr]


def answer_metadata(frame: CallFrame) -> bool:
    """Whether this call is XLA's metadata query (made once, when the handler is
    registered); if so, the API version and traits are written into it."""
    ext = frame.extension_start
    while ext:
        if ext.contents.type == METADATA:
            meta = ctypes.cast(ext, ctypes.POINTER(MetadataExtension)).contents.metadata.contents
            meta.api_version.major_version, meta.api_version.minor_version = api_version()
            meta.traits = 0
            return True
        ext = ext.contents.next
    return False


def _shape(buf: Buffer) -> tuple[int, ...]:
    return tuple(buf.dims[: buf.rank]) if buf.rank else ()


def host_arrays(args: Args) -> list[np.ndarray]:
    """The buffers of an argument or result list as numpy arrays over XLA's memory (no
    copy), tokens left out."""
    found = [Buffer.from_address(args.args[i]) for i in range(args.size)]
    return [host_array(b) for b in found if b.dtype != TOKEN]


def host_array(buf: Buffer) -> np.ndarray:
    """The XLA buffer ``buf`` as a numpy array over its memory (no copy)."""
    dtype, shape = DTYPES[buf.dtype], _shape(buf)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    memory = memoryview((ctypes.c_char * nbytes).from_address(buf.data)).cast("B")
    return np.frombuffer(memory, dtype).reshape(shape)


def buffers(args: Args) -> list[Buffer]:
    """The buffers of an argument or result list, tokens left out."""
    found = [Buffer.from_address(args.args[i]) for i in range(args.size)]
    return [b for b in found if b.dtype != TOKEN]


def string_attribute(attrs: Attrs, name: bytes) -> bytes:
    """The string attribute ``name`` (`KeyError` if the call has none)."""
    for i in range(attrs.size):
        span = attrs.names[i].contents
        if attrs.types[i] == STRING and ctypes.string_at(span.ptr, span.len) == name:
            value = ByteSpan.from_address(attrs.attrs[i])
            return ctypes.string_at(value.ptr, value.len)
    raise KeyError(name)


def error(frame: CallFrame, message: str, code: int = INTERNAL) -> int | None:
    """An ``XLA_FFI_Error`` for ``message`` (XLA takes it over; the call fails with it)."""
    args = ErrorCreateArgs(ctypes.sizeof(ErrorCreateArgs), None, message.encode(errors="replace"), code)
    result: int | None = frame.api.contents.error_create(ctypes.byref(args))
    return result


def stream(frame: CallFrame) -> int:
    """The GPU stream XLA runs this call on (``XLA_FFI_Stream_Get``)."""
    args = StreamGetArgs(ctypes.sizeof(StreamGetArgs), None, frame.ctx, None)
    failed = frame.api.contents.stream_get(ctypes.byref(args))
    if failed:
        raise RuntimeError("XLA_FFI_Stream_Get failed")
    return int(args.stream or 0)
