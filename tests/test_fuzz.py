"""10,000 generated bad calls at the public functions (world size 1): each raises TypeError
or ValueError, nothing crashes, and no input changes. fcoll.testing picks the seed (shown
in the header; rerun with --hypothesis-seed) and turns off the example database."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fcoll as fc
from tests.strategies import CASES, arrays

pytestmark = pytest.mark.skipif(fc.get_world_size() != 1, reason="single-process fuzzing")

@st.composite
def bad_calls(draw: st.DrawFn) -> tuple[str, np.ndarray, object]:
    name = draw(st.sampled_from(sorted(CASES)))
    x = arrays(draw)
    bad = draw(CASES[name][0])
    return name, x, bad


@settings(max_examples=10_000, suppress_health_check=list(HealthCheck))
@given(bad_calls())
def test_bad_calls_raise_type_or_value_error(case):
    name, x, bad = case
    before = x.copy()
    bad_copy = bad.copy() if isinstance(bad, np.ndarray) else None
    with pytest.raises((TypeError, ValueError)):
        CASES[name][1](x, bad)
    assert np.array_equal(x, before) and x.dtype == before.dtype, name
    if bad_copy is not None:
        assert bad.tobytes() == bad_copy.tobytes(), name
