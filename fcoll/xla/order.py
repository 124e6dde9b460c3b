"""The order of eager and jitted calls in one process: eager calls wait for jitted ones
that the Python handler serves (it uses MPI on XLA's thread, and MPI runs at
``serialized``); `fcoll.xla.handler` and `fcoll.xla.channel` share it.

Example:
    >>> arm()                 # a lowered call goes to the Python handler
    >>> fc.all_reduce(x)      # first waits for the jitted functions dispatched before it
"""

from __future__ import annotations

import sys
import threading

from fcoll import runtime
from fcoll.groups.group import Group

_HANDLING = threading.local()  # .active: this thread is serving a jitted call
USER_GROUPS: dict[tuple[int, ...], Group] = {}  # the groups traced calls named, by ranks


def wait_for_jitted() -> None:
    """Wait until the jitted functions dispatched so far have run their collectives
    (`jax.effects_barrier`), unless called from the handler itself. An error of theirs is
    left to their outputs, which raise it where they are read."""
    if getattr(_HANDLING, "active", False):
        return
    jax = sys.modules["jax"]
    try:
        jax.effects_barrier()
    except Exception:  # a failed jitted function: its outputs report it
        sys.modules["jax._src.dispatch"].runtime_tokens.clear()


def arm() -> None:
    """Make eager calls wait for jitted ones (`wait_for_jitted`) from now on: called when a
    collective the Python handler serves is lowered. The default group's fast paths are
    dropped (they would skip the wait)."""
    runtime.add_before_call(wait_for_jitted)


def disarm() -> None:
    """Undo `arm` once every jitted collective dispatched so far has run (`wait_for_jitted`):
    eager calls stop waiting and the fast paths come back. For a program (or a test
    module) that is done with jitted collectives; a later traced collective arms again.

    Example:
        >>> step(params)                  # jitted, with collectives inside
        >>> disarm()                      # then eager calls only: 8 B back to ~1.4 us
    """
    if wait_for_jitted in runtime._BEFORE:
        wait_for_jitted()
        runtime.remove_before_call(wait_for_jitted)
