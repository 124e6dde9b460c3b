"""What every rank of an fcoll.testing session must agree on: the tests it collected, and
the examples Hypothesis draws (one seed, one profile)."""

from __future__ import annotations

import pytest


def compare_collections(lists: list[list[str]]) -> str | None:
    """None when every rank collected the same tests in the same order, else why not.

    Example:
        >>> compare_collections([["t.py::a", "t.py::b"], ["t.py::a", "t.py::b"]]) is None
        True
    """
    first = lists[0]
    for rank, ids in enumerate(lists):
        if ids != first:
            at = next((i for i, (a, b) in enumerate(zip(first, ids, strict=False)) if a != b),
                      min(len(first), len(ids)))
            return (f"the ranks collected different tests (rank 0: {len(first)}, rank {rank}: "
                    f"{len(ids)}; first difference at position {at}: "
                    f"{first[at] if at < len(first) else None!r} vs "
                    f"{ids[at] if at < len(ids) else None!r}); collection must not depend on the "
                    "rank: skip inside the test or with a marker instead")
    return None


def hypothesis_profile(config: pytest.Config, seed: int) -> str | None:
    """Make Hypothesis draw the same examples on every rank; returns the header line.

    Example:
        >>> hypothesis_profile(config, 1234)
        "hypothesis seed 1234 on every rank (rerun with --hypothesis-seed=1234); profile ..."
    """
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return None
    current = settings()
    settings.register_profile(
        "fcoll.testing", parent=current, database=None, deadline=None,
        suppress_health_check=[*current.suppress_health_check, HealthCheck.too_slow])
    settings.load_profile("fcoll.testing")
    if getattr(config.option, "hypothesis_seed", "absent") is None:
        config.option.hypothesis_seed = str(seed)
    chosen = getattr(config.option, "hypothesis_seed", seed)
    return (f"hypothesis seed {chosen} on every rank (rerun with --hypothesis-seed={chosen}); "
            "profile 'fcoll.testing': no database, no deadline")
