"""The buckets of `fcoll.dp.GradientAverager`: leaves of one dtype and one array module
packed into one flat array, and the operation whose value is one averaging step's result.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from fcoll.calls.work import Operation, Work
from fcoll.dispatch.pytrees import Array
from fcoll.groups.group import Group


class Bucket:
    """Leaves (by key) of one dtype and one array module, packed into one flat array."""

    def __init__(self, xp: ModuleType) -> None:
        self.xp = xp
        self.keys: list[Any] = []
        self.arrays: list[Array] = []
        self.nbytes = 0

    def add(self, key: Any, array: Array) -> None:
        """Append one leaf (it is copied into the bucket by `flat`)."""
        self.keys.append(key)
        self.arrays.append(array)
        self.nbytes += array.nbytes

    def flat(self) -> Array:
        """A new flat array of the leaves, each in C order (numpy or cupy, as they are)."""
        return self.xp.concatenate([a.reshape(-1) for a in self.arrays])

    def unpack(self, averaged: Array) -> dict[Any, Array]:
        """``{key: view of averaged}``, each shaped like the leaf that went in."""
        out, offset = {}, 0
        for key, array in zip(self.keys, self.arrays, strict=True):
            out[key] = averaged[offset : offset + array.size].reshape(array.shape)
            offset += array.size
        return out


class Buckets(Operation):
    """All buckets of one averaging step; its value is ``{key: averaged}``."""

    def __init__(self, group: Group, launched: list[tuple[Bucket, Any]]) -> None:
        super().__init__("average_gradients", group)
        self._launched = launched

    def _advance(self) -> bool:
        if all(not isinstance(r, Work) or r.is_completed() for _, r in self._launched):
            self._block()
            return True
        return False

    def _block(self) -> None:
        self.value = {}
        for bucket, result in self._launched:
            self.value.update(bucket.unpack(result.wait() if isinstance(result, Work) else result))

    def finish(self, timeout: float | None) -> Any:
        for _, result in self._launched:
            if isinstance(result, Work):
                result.wait(timeout)
        return super().finish(timeout)


class Done(Operation):
    """An operation with nothing to communicate (no_sync): its value is known."""

    def __init__(self, group: Group, value: Any) -> None:
        super().__init__("average_gradients", group)
        self.value = value
        self._complete()

    def _advance(self) -> bool:
        return True
