"""What runs when a jitted JAX function reaches one of fcoll's collectives: the Python FFI
handler, on XLA's thread, for the calls the compiled one (`fcoll.xla.channel`,
fcoll/backends/_shmxla.c) hands on, or for every call where the compiled core does not run.

The handler (a Python function behind a C pointer, `fcoll.xla.capi`) reads the call's
description (the string attribute ``fcoll``: the collective, the group's global ranks,
its parameters), views XLA's buffers as numpy arrays (cupy on a GPU, on XLA's stream),
runs `fcoll.xla.semantics` on them and copies the results into XLA's output buffers. So the
collectives inside ``jit`` are fcoll's own, with fcoll's transports, debug checks,
deadlines and flight record. Three rules keep that safe on another thread:

- Each group gets its own duplicate communicator for jitted calls (its jit channel's,
  made where the group's first collective is lowered; else at its first jitted call,
  collective over the group, at the same point on every rank), so their messages never
  meet the eager calls' and their call numbers are their own.
- The calls this module serves are serialised with eager fcoll calls (MPI runs at
  ``serialized``): once a jitted function has a collective served here, an eager call first
  waits for the jitted functions dispatched before it (`fcoll.xla.order`, JAX's effects
  barrier), and a lock keeps two handlers apart. The compiled handler's calls
  (`fcoll.xla.channel`) touch neither MPI nor Python: eager calls need not wait for them.
- An exception becomes an XLA error carrying its type and message: the jitted function's
  outputs raise it (``jax.errors.JaxRuntimeError``) where they are read, on every rank that
  raised, as the eager call would have; nothing is thrown across the C boundary.

Example:
    >>> register("cpu")          # once, before the first jitted function with a collective
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
from typing import Any

import numpy as np

from fcoll import runtime
from fcoll.calls.errors import CollectiveTimeoutError
from fcoll.groups.group import Group, world
from fcoll.xla import capi, channel, semantics
from fcoll.xla.order import _HANDLING, USER_GROUPS, arm, disarm, wait_for_jitted

__all__ = ["USER_GROUPS", "arm", "disarm", "jit_group", "register", "wait_for_jitted"]

ATTRIBUTE = "fcoll"  # the custom call's attribute holding the call's description
TARGETS = {"cpu": "fcoll_collective_cpu", "cuda": "fcoll_collective_cuda"}

_LOCK = threading.Lock()
_JIT_GROUPS: dict[tuple[int, ...], Group] = {}  # their duplicates for jitted calls
_CALLS: dict[bytes, tuple[str, tuple[int, ...], dict[str, Any]]] = {}
_REGISTERED: set[str] = set()


def describe(kind: str, ranks: tuple[int, ...], params: dict[str, Any]) -> str:
    """The attribute text of a call (parsed back by `_call`)."""
    return json.dumps({"kind": kind, "ranks": list(ranks), **params}, sort_keys=True)


def _call(text: bytes) -> tuple[str, tuple[int, ...], dict[str, Any]]:
    """``(kind, ranks, params)`` of a call's attribute text (cached: a jitted loop reads
    the same text at every step)."""
    found = _CALLS.get(text)
    if found is None:
        params = json.loads(text)
        kind, ranks = params.pop("kind"), tuple(params.pop("ranks"))
        if "src_dst" in params:
            params["src_dst"] = tuple(params["src_dst"])
        found = _CALLS[text] = (kind, ranks, params)
    return found


def jit_group(ranks: tuple[int, ...]) -> Group:
    """The duplicate of the group of ``ranks`` that jitted calls use (made at its first
    jitted call, collectively over the group; the deadline follows the user's group)."""
    user = USER_GROUPS.get(ranks)
    g = _JIT_GROUPS.get(ranks)
    if g is None:
        if user is None:  # a compiled function from a cache, in a process that never traced it
            user = world() if ranks == world().ranks else _ranks_group(ranks)
        g = _JIT_GROUPS[ranks] = Group(user.comm("jit").Dup(), user.ranks, user.timeout)
    if user is not None:
        g.timeout = user.timeout
    return g


def _ranks_group(ranks: tuple[int, ...]) -> Group:
    from fcoll.groups.group import new_group

    return new_group(list(ranks))


def _serve(frame: capi.CallFrame, device: bool) -> None:
    kind, ranks, params = _call(capi.string_attribute(frame.attrs, ATTRIBUTE.encode()))
    g = jit_group(ranks)
    if device:
        from fcoll.xla import device as gpu

        gpu.serve(frame, kind, g, params)
        return
    ins, outs = capi.host_arrays(frame.args), capi.host_arrays(frame.rets)
    channel.enter(g)
    try:
        got = semantics.run(kind, ins, g, np, params)
    finally:
        channel.leave(g, USER_GROUPS.get(ranks, g))  # its segment may have grown
    for out, y in zip(outs, got, strict=True):
        np.copyto(out, y.reshape(out.shape))


def _code(error: BaseException) -> int:
    if isinstance(error, CollectiveTimeoutError):
        return capi.DEADLINE_EXCEEDED
    if isinstance(error, (TypeError, ValueError)):
        return capi.INVALID_ARGUMENT
    return capi.UNIMPLEMENTED if isinstance(error, NotImplementedError) else capi.INTERNAL


def _handle(pointer: Any, device: bool) -> int | None:
    frame = pointer.contents
    try:
        if capi.answer_metadata(frame) or frame.stage != capi.EXECUTE:
            return None
        with _LOCK:
            _HANDLING.active = True
            try:
                _serve(frame, device)
            finally:
                _HANDLING.active = False
        return None
    except BaseException as error:  # reported to XLA: nothing may cross the C boundary
        text = f"fcoll: {type(error).__name__}: {error}"
        try:
            return capi.error(frame, text, _code(error))
        except BaseException:  # no error object could be made: the job cannot go on
            sys.stderr.write(text + "\n")
            runtime.abort(1)
            return None


def _cpu(pointer: Any) -> int | None:
    return _handle(pointer, False)


def _gpu(pointer: Any) -> int | None:
    return _handle(pointer, True)


# The C function pointers XLA calls (kept alive here for the life of the process).
_cpu_handler: Any = capi.HANDLER(_cpu)
_gpu_handler: Any = capi.HANDLER(_gpu)


def register(platform: str) -> str:
    """Register the handler for ``platform`` (``cpu`` or ``cuda``) with XLA, once; returns
    the custom call's target name. On the CPU that is the compiled handler
    (`fcoll.xla.channel`) where the compiled core runs, handing this module's the calls it
    does not serve; else, or where this jaxlib refuses it, this module's, through ctypes."""
    jax: Any = sys.modules["jax"]
    name = TARGETS[platform]
    if platform not in _REGISTERED:
        handler = _cpu_handler if platform == "cpu" else _gpu_handler
        address = ctypes.cast(handler, ctypes.c_void_p).value
        if platform != "cpu" or not register_compiled(jax.ffi, name, address):
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(address),
                                        platform="cpu" if platform == "cpu" else "CUDA")
        _REGISTERED.add(platform)
    return name


def register_compiled(ffi: Any, name: str, address: int | None) -> bool:
    """Register the compiled handler as ``name`` on the CPU (``address``: this module's
    handler, for the calls it hands on): True; False where the compiled core does not run
    or ``ffi.register_ffi_target`` refuses it (the channels are then off for good:
    `fcoll.xla.channel.refuse`)."""
    compiled = channel.compiled()
    if compiled is None:
        return False
    try:
        compiled.xla_setup(address, channel.told)
        ffi.register_ffi_target(name, compiled.xla_handler(), platform="cpu")
    except Exception as error:  # e.g. an XLA that no longer takes FFI API 0.1
        channel.refuse(f"{type(error).__name__}: {error}")
        return False
    return True
