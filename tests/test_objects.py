"""Object collectives: nested builtins and user classes; unpicklable objects raise
everywhere instead of hanging."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import fcoll as fc


class Foo:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is Foo and all(
            np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            for a, b in zip(vars(self).values(), vars(other).values(), strict=True))


def objects():
    f = Foo(10)
    f.bar = 1
    return [{"key1": 3, "key2": 4, "key3": {"nested": True}}, f,
            Foo(np.random.default_rng(0).standard_normal((3, 3))), "foo",
            [1, 2, True, "string", [4, 5, "nested"]], None, b"\x00bytes"]


L = objects()
PICKLE_ERROR = r"Can't pickle local object|could not pickle"


@pytest.mark.smoke
def test_all_gather_object(group):
    got = fc.all_gather_object(L[group.rank % len(L)], group.arg)
    assert got == [L[i % len(L)] for i in range(group.size)]


def test_gather_object_every_root(group):
    for dst in range(group.size):
        got = fc.gather_object(L[group.rank % len(L)], dst, group.arg)
        if group.rank == dst:
            assert got == [L[i % len(L)] for i in range(group.size)]
        else:
            assert got is None


@pytest.mark.smoke
def test_broadcast_object(group):
    for src in range(group.size):
        assert fc.broadcast_object(L if group.rank == src else None, src, group.arg) == L


def test_scatter_object(group):
    for src in range(group.size):
        objs = [L[i % len(L)] for i in range(group.size)] if group.rank == src else None
        assert fc.scatter_object(objs, src, group.arg) == L[group.rank % len(L)]


def test_unpicklable_raises_on_every_rank(group):
    class Local:  # a local class cannot be pickled
        pass

    bad = group.size - 1
    mine = Local() if group.rank == bad else {"ok": group.rank}
    own_error = (AttributeError, pickle.PicklingError, TypeError)
    for call in (lambda: fc.all_gather_object(mine, group.arg),
                 lambda: fc.gather_object(mine, 0, group.arg)):
        with pytest.raises(own_error if group.rank == bad else ValueError,
                           match=PICKLE_ERROR):
            call()
    with pytest.raises(own_error if group.rank == bad else ValueError,
                       match=PICKLE_ERROR):
        fc.broadcast_object(mine if group.rank == bad else None, bad, group.arg)
    objs = [Local()] * group.size if group.rank == bad else None
    with pytest.raises(own_error if group.rank == bad else ValueError,
                       match=PICKLE_ERROR):
        fc.scatter_object(objs, bad, group.arg)
    assert fc.all_gather_object(group.rank, group.arg) == list(range(group.size))
