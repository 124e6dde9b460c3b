"""Argument errors: raised on the rank that made them, before anything is sent.

Each bad call is made on one rank only; had it sent anything, that rank would block (and
the harness would abort the job). The barrier after it proves nothing is pending."""

from __future__ import annotations

import copy
import datetime
import math
import pickle

import numpy as np
import pytest

import fcoll as fc
from fcoll import runtime
from fcoll.groups.membership import member

X = np.ones((4, 3))
BAD_CALLS = [
    (TypeError, r"all_reduce: expected x to be a numpy.ndarray, got list; pass np.asarray",
     lambda n: fc.all_reduce([1.0, 2.0])),
    (TypeError, r"expected x to be a numpy.ndarray, got float", lambda n: fc.broadcast(1.0)),
    (TypeError, r"expected x to be a numpy.ndarray, got float32",
     lambda n: fc.all_reduce(np.float32(1))),
    (TypeError, r"expected x to have a dtype in .* got object",
     lambda n: fc.all_reduce(np.array([None]))),
    (TypeError, r"got <U1", lambda n: fc.all_gather(np.array(["a"]))),
    (TypeError, r"got datetime64", lambda n: fc.broadcast(np.array(["2020"], "datetime64[D]"))),
    (ValueError, r"expected op in .* got 'total'", lambda n: fc.all_reduce(X, "total")),
    (TypeError, r"expected op to be a str, fcoll.ReduceOp.* got int", lambda n: fc.all_reduce(X, 3)),
    (TypeError, r"expected a floating or complex dtype for ReduceOp.AVG, got int32",
     lambda n: fc.all_reduce(np.ones(2, np.int32), "avg")),
    (TypeError, r"expected a floating or complex dtype .* got bool",
     lambda n: fc.all_reduce(np.ones(2, bool), "mean")),
    (TypeError, r"expected an integer or bool dtype for band, got float64",
     lambda n: fc.all_reduce(X, "band")),
    (TypeError, r"expected a floating or complex dtype for premul_sum\(2\), got int64",
     lambda n: fc.all_reduce(np.ones(2, np.int64), fc.premul_sum(2))),
    (TypeError, r"expected a real premul_sum factor", lambda n: fc.all_reduce(X, fc.premul_sum(1j))),
    (ValueError, r"invalid root rank: expected 0 <= src < \d+ .* got -1",
     lambda n: fc.broadcast(X, src=-1)),
    (ValueError, r"invalid root rank: expected 0 <= dst < \d+", lambda n: fc.reduce(X, dst=n)),
    (TypeError, r"expected dst to be an int group rank, got str", lambda n: fc.gather(X, dst="0")),
    (ValueError, r"invalid root rank", lambda n: fc.scatter(None, src=n)),
    (ValueError, r"expected gather_dim in \[-2, 2\) for an array of shape \(4, 3\), got 2",
     lambda n: fc.all_gather_into_tensor(X, gather_dim=2)),
    (ValueError, r"expected scatter_dim in \[-2, 2\)",
     lambda n: fc.reduce_scatter_tensor(X, scatter_dim=-3)),
    (ValueError, r"(expected x.shape\[1\] divisible by the group's size \d+, got shape|"
     r"expected x with at least 1 dimension for scatter_dim)",
     lambda n: fc.reduce_scatter_tensor(np.ones((2, n + 1)) if n > 1 else np.ones(()), scatter_dim=1)),
    (ValueError, r"expected sizes to have \d+ entries \(the group's size\), got \d+",
     lambda n: fc.all_gather_into_tensor(X, sizes=[4] * (n + 1))),
    (ValueError, r"expected x.shape\[0\] == sizes\[\d\] == 5",
     lambda n: fc.all_gather_into_tensor(X, sizes=[5] * n)),
    (TypeError, r"expected sizes to be a list of ints", lambda n: fc.all_gather_into_tensor(X, sizes="4")),
    (ValueError, r"expected sum\(input_split_sizes\) == x.shape\[0\] == 4",
     lambda n: fc.all_to_all_single(X, None, [5] + [0] * (n - 1))),
    (ValueError, r"expected non-negative input_split_sizes",
     lambda n: fc.all_to_all_single(X, None, [-1] * n)),
    (ValueError, r"expected output_split_sizes to have \d+ entries",
     lambda n: fc.all_to_all_single(X, [1] * (n + 1), [4] + [0] * (n - 1))),
    (ValueError, r"expected x with at least 1 dimension", lambda n: fc.all_to_all_single(np.ones(()))),
    (ValueError, r"(expected x.shape\[0\] divisible by the group's size|at least 1 dimension)",
     lambda n: fc.all_to_all_single(np.ones(n + 1) if n > 1 else np.ones(()))),
    (ValueError, r"expected chunks to hold \d+ arrays \(one per group rank\), got \d+",
     lambda n: fc.all_to_all([X] * (n + 1))),
    (TypeError, r"expected chunks to be a list of numpy arrays, got ndarray",
     lambda n: fc.reduce_scatter(X)),
    (TypeError, r"expected xs to be a list of numpy arrays", lambda n: fc.all_reduce_coalesced(X)),
    (TypeError, r"expected xs\[1\] to be a numpy.ndarray", lambda n: fc.all_reduce_coalesced([X, 1])),
    (TypeError, r"expected group to be None, a fcoll.Group, a list of ranks or .* got str",
     lambda n: fc.all_reduce(X, group="world")),
    (TypeError, r"premul_sum: expected factor to be a real or complex number, got str",
     lambda n: fc.premul_sum("2")),
]


@pytest.mark.parametrize(("error", "message", "call"), BAD_CALLS,
                         ids=[f"{i}-{e.__name__}" for i, (e, _, _) in enumerate(BAD_CALLS)])
def test_bad_argument_raises_before_sending(error, message, call, rank, world_size):
    try:
        if rank == world_size - 1:
            with pytest.raises(error, match=message):
                call(world_size)
    finally:  # a failure here must not leave the other ranks in the barrier
        fc.barrier()


def test_scatter_chunks_on_non_src(rank, world_size):
    try:
        if world_size > 1 and rank == 1:
            with pytest.raises(ValueError, match=r"expected chunks=None on ranks other than src=0"):
                fc.scatter([X] * world_size, src=0)
    finally:
        fc.barrier()


def test_reduce_op_enum():
    for op in fc.ReduceOp:
        assert isinstance(op, fc.ReduceOp) and fc.ReduceOp(op) is op
        assert copy.copy(op) is op and copy.deepcopy(op) is op and pickle.loads(pickle.dumps(op)) is op
        assert fc.ReduceOp(op) != "abc" and None not in (op, fc.ReduceOp(op))
    assert fc.ReduceOp("MEAN") is fc.ReduceOp.AVG and fc.ReduceOp("Prod") is fc.ReduceOp.PRODUCT
    for factor in (1.0, 2.0):
        p = fc.premul_sum(factor)
        assert p.factor == factor and pickle.loads(pickle.dumps(p)) == p == copy.deepcopy(p)


def test_init_arguments():
    fc.init()  # idempotent
    fc.init(timeout=datetime.timedelta(seconds=30))
    assert runtime.settings().timeout == 30.0
    fc.init(timeout=None)  # leaves the default deadline as it is
    assert runtime.settings().timeout == 30.0
    fc.init(timeout=math.inf)  # clears it: later tests run without a default deadline
    assert runtime.settings().timeout is None
    g = fc.new_group(timeout=math.inf)  # a group that waits forever under a job-wide deadline
    fc.init(timeout=30)
    try:
        _, call = member(g, "barrier")
        assert call.seconds is None and member(None, "barrier")[1].seconds == 30.0
    finally:
        fc.init(timeout=math.inf)
        g.destroy()
    with pytest.raises(ValueError, match="debug"):
        fc.init(debug="loud")
    with pytest.raises(TypeError, match="timeout"):
        fc.init(timeout="soon")
    with pytest.raises(ValueError, match="positive"):
        fc.init(timeout=0)
