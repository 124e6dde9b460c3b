"""pyproject.toml's GPU extras: one per CUDA major, each naming a cupy and an NCCL wheel of
that major, `gpu` an alias of one of them, and each documented in docs/gpu.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# cupy-cuda12x, nvidia-nccl-cu13, ...: the CUDA major a wheel is built for.
_MAJOR = re.compile(r"^(?:cupy-cuda(?P<cupy>\d+)x|nvidia-nccl-cu(?P<nccl>\d+))\b")
_SELF = re.compile(r"^fcoll\[(?P<extras>[^\]]+)\]")


def _extras() -> dict[str, list[str]]:
    """Each extra's requirements, with ``fcoll[other]`` expanded (as the wheel's metadata)."""
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def expand(name: str) -> list[str]:
        out = []
        for requirement in declared[name]:
            match = _SELF.match(requirement)
            if match is None:
                out.append(requirement)
            else:
                out.extend(r for other in match["extras"].split(",") for r in expand(other.strip()))
        return out

    return {name: expand(name) for name in declared}


def _majors(requirements: list[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"cupy": set(), "nccl": set()}
    for requirement in requirements:
        match = _MAJOR.match(requirement)
        if match is not None:
            kind = "cupy" if match["cupy"] else "nccl"
            found[kind].add(int(match[kind]))
    return found


@pytest.mark.parametrize("major", [12, 13])
def test_gpu_extra_per_cuda_major_names_matching_cupy_and_nccl(major):
    extras = _extras()
    assert f"gpu-cuda{major}" in extras, sorted(extras)
    assert _majors(extras[f"gpu-cuda{major}"]) == {"cupy": {major}, "nccl": {major}}


def test_gpu_is_an_alias_of_one_cuda_extra():
    extras = _extras()
    assert any(extras["gpu"] == extras[f"gpu-cuda{major}"] for major in (12, 13)), extras["gpu"]


def test_every_gpu_extra_is_documented():
    extras = [name for name in _extras() if name.startswith("gpu")]
    text = (ROOT / "docs" / "gpu.md").read_text()
    assert [name for name in extras if f"fcoll[{name}]" not in text] == []


# -- the compiled core is optional ------------------------------------------------------------


@pytest.mark.skipif(__import__("fcoll").get_world_size() != 1, reason="one process")
@pytest.mark.parametrize("compiler", ["gcc", "false"])
def test_the_build_succeeds_with_or_without_a_c_compiler(tmp_path, compiler):
    """setup.py's extension is optional: with no working compiler (``CC=false``) the build
    still succeeds and leaves no extension (fcoll then steps the segment in numpy)."""
    import os
    import shutil
    import subprocess

    if shutil.which(compiler) is None:
        pytest.skip(f"no {compiler}")
    env = {**os.environ, "CC": compiler, "LDSHARED": f"{compiler} -shared"}
    done = subprocess.run([sys.executable, str(ROOT / "setup.py"), "-q", "build_ext",
                           "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    built = list((tmp_path / "lib").rglob("_shmcore*.so"))
    if compiler == "false":
        assert not built and "building extension" in done.stderr and "failed" in done.stderr, done.stderr
    else:
        assert len(built) == 1, done.stderr
