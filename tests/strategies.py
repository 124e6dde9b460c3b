"""Hypothesis strategies of bad arguments for the public functions, shared by the
single-process fuzzing (test_fuzz) and the cross-rank debug-mode property (test_detail)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import fcoll as fc

_VALID_OPS = {"sum", "avg", "mean", "product", "prod", "min", "max", "band", "bor", "bxor"}
_TEXT = st.text(max_size=4)
# An object whose repr holds its address: differs between processes making equal calls.
_OPAQUE = st.builds(object)
_NUMBER = st.one_of(st.floats(allow_nan=True), st.complex_numbers(max_magnitude=1e3))
BAD_ARRAYS = st.one_of(
    st.sampled_from([(1,), 3, 2.5, None, {"a": 1}, np.float32(1.0), np.array([None]),
                     np.array([1], "datetime64[D]"), np.zeros(2, "V4"), np.ones(2, ">f4")]),
    st.lists(st.floats(), max_size=3), _TEXT, _NUMBER, _OPAQUE,
    st.builds(lambda n, s: np.array([s] * n, dtype="U4"), st.integers(0, 4), _TEXT))
BAD_OPS = st.one_of(_TEXT.filter(lambda t: t.lower() not in _VALID_OPS), st.integers(),
                    _NUMBER, st.none(), st.just(("sum",)), st.just(["sum"]), _OPAQUE)
BAD_DIMS = st.one_of(st.integers(min_value=2), st.integers(max_value=-3), st.floats(),
                     _TEXT, st.none(), st.booleans())
BAD_ROOTS = st.one_of(st.integers(max_value=-1), st.integers(min_value=1), st.floats(),
                      _TEXT, st.none(), st.booleans())
BAD_SIZES = st.one_of(st.lists(st.integers(-5, 9), min_size=2, max_size=4),
                      st.lists(st.integers(max_value=-1), min_size=1, max_size=1),
                      _TEXT.filter(lambda t: t != "auto"),
                      st.lists(st.floats(), min_size=1, max_size=1), st.integers())
BAD_SPLITS = st.one_of(st.lists(st.integers(-3, 9), min_size=2, max_size=3),
                       st.lists(st.integers(-3, 9).filter(lambda v: v != 4), min_size=1,
                                max_size=1),
                       st.lists(st.floats(), min_size=1, max_size=1), _TEXT)
BAD_LISTS = st.one_of(st.just([]), st.lists(st.floats(), min_size=1, max_size=2), _TEXT,
                      st.lists(_OPAQUE, min_size=1, max_size=4),
                      st.just(np.ones(3)), st.just([np.ones(1), np.ones(1, np.float16)]),
                      st.integers(2, 4).map(lambda n: [np.ones(1)] * n))
BAD_PEERS = st.one_of(st.integers().filter(lambda v: v != 0), st.floats(), _TEXT, st.none())


def _closed() -> fc.Group:
    g = fc.new_group([0])
    g.destroy()
    return g


BAD_GROUPS = st.one_of(
    st.lists(st.integers(-3, 5), min_size=1, max_size=3).filter(lambda r: r != [0]),
    _TEXT, st.floats(), st.just(_closed()))
BAD_NEW_GROUP = st.one_of(
    st.lists(st.integers(-3, 5), min_size=1, max_size=3).filter(lambda r: r != [0]),
    _TEXT.filter(lambda t: t != ""), st.floats())


def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(["float64", "float32", "int32", "bool", "complex64"]))
    shape = draw(st.sampled_from([(4, 2), (2, 4), (4,)]))
    return np.arange(np.prod(shape)).reshape(shape).astype(dtype)


CASES = {
    "all_reduce x": (BAD_ARRAYS, lambda x, b: fc.all_reduce(b)),
    "all_reduce op": (BAD_OPS, lambda x, b: fc.all_reduce(x, b)),
    "all_reduce group": (BAD_GROUPS, lambda x, b: fc.all_reduce(x, group=b)),
    "reduce dst": (BAD_ROOTS, lambda x, b: fc.reduce(x, dst=b)),
    "broadcast src": (BAD_ROOTS, lambda x, b: fc.broadcast(x, src=b)),
    "broadcast x": (BAD_ARRAYS, lambda x, b: fc.broadcast(b)),
    "gather dst": (BAD_ROOTS, lambda x, b: fc.gather(x, dst=b)),
    "scatter src": (BAD_ROOTS, lambda x, b: fc.scatter([x], src=b)),
    "scatter chunks": (BAD_LISTS, lambda x, b: fc.scatter(b, src=0)),
    "all_gather_into_tensor dim": (BAD_DIMS, lambda x, b: fc.all_gather_into_tensor(
        x.reshape(4, 2), gather_dim=b)),
    "all_gather_into_tensor sizes": (BAD_SIZES, lambda x, b: fc.all_gather_into_tensor(
        x.reshape(4, 2), sizes=b)),
    "reduce_scatter_tensor dim": (BAD_DIMS, lambda x, b: fc.reduce_scatter_tensor(
        x.reshape(4, 2), scatter_dim=b)),
    "reduce_scatter_tensor op": (BAD_OPS, lambda x, b: fc.reduce_scatter_tensor(x, b)),
    "all_to_all_single in": (BAD_SPLITS, lambda x, b: fc.all_to_all_single(
        x.reshape(4, 2), None, b)),
    "all_to_all_single out": (BAD_SPLITS, lambda x, b: fc.all_to_all_single(
        x.reshape(4, 2), b, [4])),
    "all_gather x": (BAD_ARRAYS, lambda x, b: fc.all_gather(b)),
    "all_to_all chunks": (BAD_LISTS, lambda x, b: fc.all_to_all(b)),
    "reduce_scatter chunks": (BAD_LISTS, lambda x, b: fc.reduce_scatter(b)),
    "all_reduce_coalesced": (BAD_ARRAYS.map(lambda a: [a]),
                             lambda x, b: fc.all_reduce_coalesced(b)),
    "coalesced op": (BAD_OPS, lambda x, b: fc.reduce_scatter_tensor_coalesced([x], b)),
    "isend dst": (BAD_PEERS, lambda x, b: fc.isend(x, b)),
    "permute_tensor": (st.one_of(BAD_SIZES, BAD_SPLITS).filter(lambda s: s not in ([0], [None])),
                       lambda x, b: fc.permute_tensor(x, b)),
    "broadcast_object src": (BAD_ROOTS, lambda x, b: fc.broadcast_object(x, src=b)),
    "new_group": (BAD_NEW_GROUP, lambda x, b: fc.new_group(b)),
    "premul_sum": (st.one_of(_TEXT, st.none(), st.lists(st.floats(), max_size=2),
                             st.booleans()), lambda x, b: fc.premul_sum(b)),
}
