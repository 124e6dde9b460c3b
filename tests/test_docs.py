"""Documentation that can be checked mechanically: every public function, class and method
has a docstring with an ``Example:`` section holding at least one ``>>>`` line, every
public property has a docstring, and the wheel ships ``py.typed``. Local only (no MPI)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fcoll as fc

ROOT = Path(__file__).resolve().parents[1]
# A Google-style section heading "Example:" / "Examples:", then an indented ">>>" line.
_EXAMPLE = re.compile(r"^\s*Examples?:\s*\n(?:\s*\n)*\s+>>> ", re.MULTILINE)


def _module_api(module: Any) -> Iterator[tuple[str, Any]]:
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        and (inspect.isfunction(v) or inspect.isclass(v))
    ]
    for name in names:
        value = getattr(module, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            yield f"{module.__name__}.{name}", value


def _class_members(qualname: str, cls: type) -> Iterator[tuple[str, Any, bool]]:
    """(name, object, needs an example) for the public members the class itself defines."""
    for name, value in vars(cls).items():
        if name.startswith("_") or (inspect.isclass(cls) and issubclass(cls, BaseException)):
            continue
        if isinstance(value, property):
            yield f"{qualname}.{name}", value, False
        elif inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
            yield f"{qualname}.{name}", getattr(cls, name), True


def public_api() -> list[tuple[str, Any, bool]]:
    """Everything that must be documented: (qualified name, object, needs an example)."""
    found: list[tuple[str, Any, bool]] = []
    modules: list[Any] = [fc, fc.lax, fc.dp]
    if importlib.util.find_spec("torch") is not None:
        import fcoll.torch

        modules.append(fcoll.torch)
    for module in modules:
        for qualname, value in _module_api(module):
            found.append((qualname, value, True))
            if inspect.isclass(value) and not issubclass(value, fc.ReduceOp):
                found.extend(_class_members(qualname, value))
    return found


def docstring_problem(obj: Any, needs_example: bool) -> str | None:
    """What is missing from ``obj``'s own docstring, or None when it is complete."""
    doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
    if not doc or not doc.strip():
        return "no docstring"
    if needs_example and not _EXAMPLE.search(inspect.cleandoc(doc)):
        return "no 'Example:' section with a '>>>' line"
    return None


def test_the_walk_finds_the_api():
    names = {name for name, _, _ in public_api()}
    for expected in ("fcoll.all_reduce", "fcoll.Group.split", "fcoll.Work.wait", "fcoll.Mesh.group",
                     "fcoll.lax.psum", "fcoll.dp.GradientAverager.push", "fcoll.Group.rank"):
        assert expected in names
    assert len(names) > 80


def test_criterion_rejects_what_it_should():
    def bare() -> None: ...

    def no_example() -> None:
        """Does things.

        Args:
            x: a thing.
        """

    def prose_example() -> None:
        """Does things.

        Example:
            call it on every rank
        """

    def good() -> None:
        """Does things.

        Example:
            >>> good()       # every rank
        """

    assert docstring_problem(bare, True) == "no docstring"
    assert docstring_problem(no_example, True) is not None
    assert docstring_problem(prose_example, True) is not None
    assert docstring_problem(no_example, False) is None
    assert docstring_problem(good, True) is None


def test_every_public_name_has_a_docstring_with_an_example():
    missing = [f"{name}: {problem}" for name, obj, needs in public_api()
               if (problem := docstring_problem(obj, needs)) is not None]
    assert not missing, "\n".join(missing)


@pytest.mark.skipif(fc.get_world_size() != 1, reason="builds a wheel once, at world size 1")
def test_wheel_ships_py_typed(tmp_path):
    hatchling = pytest.importorskip("hatchling.builders.wheel")
    import zipfile

    wheel = next(iter(hatchling.WheelBuilder(str(ROOT)).build(directory=str(tmp_path),
                                                               versions=["standard"])))
    names = zipfile.ZipFile(wheel).namelist()
    assert "fcoll/py.typed" in names and "fcoll/__main__.py" in names


def test_changelog_is_in_the_docs():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog") and "## [0.1.0]" in changelog
    page = (ROOT / "docs" / "changelog.md").read_text()
    assert "CHANGELOG.md" in page
