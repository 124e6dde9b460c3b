"""`Mesh`: ranks of a group laid out row-major over named axes (torch's DeviceMesh, JAX's
Mesh). Inside ``with mesh:`` axis names are valid as ``group=`` and ``axis_name=``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fcoll.groups import active_meshes
from fcoll.groups.group import Group, resolve_group

_stack = active_meshes.mesh_stack  # the active meshes (fcoll.groups.group.resolve_group reads them)


def axis_group(names: str | Sequence[str], fn: str) -> Group:
    """The group of axis ``names`` in the innermost active mesh (``with mesh:``) that has them.

    Example:
        >>> with fc.Mesh((2, 2), ("dp", "tp")):        # mpiexec -n 4
        ...     axis_group("tp", "psum").ranks         # on rank 3
        (2, 3)
    """
    found: Group = active_meshes.axis_group(names, fn)
    return found


class Mesh:
    """Group ranks laid out row-major over named axes.

    Every rank of ``group`` constructs the mesh (the axis groups are created then, once).

    Example:
        >>> mesh = fc.Mesh((2, 2), ("dp", "tp"))     # mpiexec -n 4; rank 3 is at (1, 1)
        >>> mesh.coordinate(), mesh.group("tp").ranks
        ((1, 1), (2, 3))
        >>> with mesh:
        ...     fc.all_reduce(x, group="dp")           # over ranks 1 and 3
    """

    def __init__(self, shape: Sequence[int], names: Sequence[str], group: Any = None) -> None:
        self.parent = resolve_group(group, "Mesh")
        self.shape, self.names = _check_shape(shape, names, self.parent.size)
        self._coordinate = tuple(int(c) for c in np.unravel_index(self.parent.rank, self.shape))
        self._groups: dict[tuple[str, ...], Group] = {}
        for name in self.names:
            self.group(name)

    @property
    def ndim(self) -> int:
        """The number of axes (``len(shape)``)."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of ranks on the mesh (the product of ``shape``)."""
        return math.prod(self.shape)

    def coordinate(self) -> tuple[int, ...]:
        """This rank's position on the mesh, one index per axis.

        Example:
            >>> mesh = fc.Mesh((2, 3), ("dp", "tp"))    # mpiexec -n 6, row-major
            >>> mesh.coordinate()                      # on rank 4 (rank 0 gets (0, 0))
            (1, 1)
        """
        return self._coordinate

    def _axes(self, names: str | Sequence[str]) -> tuple[str, ...]:
        wanted = (names,) if isinstance(names, str) else tuple(names)
        unknown = [n for n in wanted if n not in self.names]
        if unknown or not wanted or len(set(wanted)) != len(wanted):
            raise ValueError(f"Mesh: expected axis names from {self.names} (each once), "
                             f"got {names!r}")
        return tuple(n for n in self.names if n in wanted)  # mesh order

    def group(self, names: str | Sequence[str]) -> Group:
        """The group of this rank and the ranks that differ from it only along ``names``
        (one axis or several); created on first use, collectively over the mesh.

        Example:
            >>> mesh = fc.Mesh((2, 3), ("dp", "tp"))    # mpiexec -n 6
            >>> mesh.group("tp").ranks, mesh.group("dp").ranks     # on rank 4
            ((3, 4, 5), (1, 4))
            >>> mesh.group(("dp", "tp")).size          # both axes: every rank
            6
        """
        axes = self._axes(names)
        if axes not in self._groups:
            self._groups[axes] = self._split(axes)
        return self._groups[axes]

    def _split(self, axes: tuple[str, ...]) -> Group:
        coord = self.coordinate()
        keep = [i for i, n in enumerate(self.names) if n in axes]
        other = [i for i in range(self.ndim) if i not in keep]
        color = int(np.ravel_multi_index([coord[i] for i in other],
                                         [self.shape[i] for i in other])) if other else 0
        key = int(np.ravel_multi_index([coord[i] for i in keep], [self.shape[i] for i in keep]))
        return self.parent.split(color, key)

    def shift(self, axis: str, disp: int = 1, *, periodic: bool = False
              ) -> tuple[int | None, int | None]:
        """``(src, dst)``: the ranks of ``mesh.group(axis)`` this rank receives from and sends
        to when data moves by ``disp`` along ``axis`` (``MPI_Cart_shift``); ``None`` past an
        edge unless ``periodic``. A rank's rank in that group is its coordinate on ``axis``.

        Example:
            >>> mesh = fc.Mesh((4,), ("x",))             # mpiexec -n 4
            >>> mesh.shift("x")                         # on rank 0; rank 3: (2, None)
            (None, 1)
            >>> mesh.shift("x", periodic=True)          # on rank 0
            (3, 1)
            >>> fc.sendrecv(x, *reversed(mesh.shift("x")), group=mesh.group("x"))  # x moves up
        """
        if not isinstance(axis, str):
            raise TypeError(f"Mesh.shift: expected axis to be one axis name (a str), got {axis!r}")
        if type(disp) is not int and (not isinstance(disp, (int, np.integer)) or isinstance(disp, bool)):
            raise TypeError(f"Mesh.shift: expected disp to be an int, got {type(disp).__name__}")
        size = self.shape[self.names.index(self._axes(axis)[0])]
        here = self.coordinate()[self.names.index(axis)]
        src, dst = here - int(disp), here + int(disp)
        if periodic:
            return src % size, dst % size
        return (src if 0 <= src < size else None), (dst if 0 <= dst < size else None)

    def __getitem__(self, name: str) -> Mesh:
        """The 1-D sub-mesh along axis ``name`` through this rank (as DeviceMesh)."""
        axes = self._axes(name)
        return Mesh((self.shape[self.names.index(axes[0])],), axes, self.group(axes))

    def __enter__(self) -> Mesh:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().remove(self)

    def __repr__(self) -> str:
        return f"Mesh(shape={self.shape}, names={self.names}, ranks={list(self.parent.ranks)})"


def _check_shape(shape: object, names: object, size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if not isinstance(shape, Sequence) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise ValueError(f"Mesh: expected shape to be a tuple of positive ints, got {shape!r}")
    if isinstance(names, str) or not isinstance(names, Sequence) or not all(
            isinstance(n, str) for n in names):
        raise TypeError(f"Mesh: expected names to be a tuple of str, got {names!r}")
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"Mesh: expected one distinct name per axis of shape {tuple(shape)}, "
                         f"got {tuple(names)}")
    if math.prod(shape) != size:
        raise ValueError(f"Mesh: expected shape {tuple(shape)} to multiply to the group's size "
                         f"{size}, got {math.prod(shape)}")
    return tuple(shape), tuple(names)


def active() -> bool:
    """Whether some mesh is active (``with mesh:``) in this thread."""
    return bool(_stack())


__all__ = ["Mesh", "active", "axis_group"]
