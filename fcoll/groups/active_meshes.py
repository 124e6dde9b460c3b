"""The meshes active under ``with mesh:``, per thread: what turns axis names into groups.

`fcoll.groups.mesh` pushes and pops them; `fcoll.groups.group.resolve_group` asks them for axis names
(duck-typed: ``names`` and ``group(names)``) without importing `fcoll.groups.mesh`, the layer above.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

# Meshes entered with ``with mesh:`` in this thread, innermost last.
_MESHES = threading.local()


def mesh_stack() -> list[Any]:
    """This thread's stack of active meshes (innermost last)."""
    stack: list[Any] | None = getattr(_MESHES, "stack", None)
    if stack is None:
        stack = _MESHES.stack = []
    return stack


def axis_group(names: str | Sequence[str], fn: str) -> Any:
    """The group of axis ``names`` in the innermost active mesh that has them."""
    wanted = (names,) if isinstance(names, str) else tuple(names)
    for mesh in reversed(mesh_stack()):
        if all(n in mesh.names for n in wanted):
            return mesh.group(wanted)  # a fcoll.groups.group.Group
    raise ValueError(f"{fn}: axis name(s) {names!r} are not axes of an active mesh; "
                     "use `with fc.Mesh(shape, names):`")
