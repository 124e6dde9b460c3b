"""Starting torch.distributed on the backend "fcoll" (issue 29): no argument and no variable
under mpiexec, ``fcoll://``, torchrun-style variables, clear errors, the torch 2.14 entry
point. Each test ends with the default group started again as `tests.torch_pg` does."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import fcoll as fc
from tests.torch_pg import dist, forget, start, torch

VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def fresh() -> Iterator[None]:
    """No default group before the test; after it, none of torch's variables, and the
    default group as `start` makes it."""
    start()
    dist.barrier()  # rank 0 serves the store: nobody may still need it when it goes
    dist.destroy_process_group()
    forget()
    saved = {v: os.environ.pop(v) for v in VARIABLES if v in os.environ}
    yield
    for v in VARIABLES:
        os.environ.pop(v, None)
    os.environ.update(saved)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    start()


def works() -> None:
    n, r = dist.get_world_size(), dist.get_rank()
    assert (dist.get_backend(), r, n) == ("fcoll", fc.get_rank(), fc.get_world_size())
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t)
    assert t.item() == n * (n + 1) / 2


def test_no_argument_no_variable(fresh: None) -> None:
    assert not any(v in os.environ for v in VARIABLES)
    dist.init_process_group("fcoll")
    works()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"key{dist.get_rank()}", "v")  # the store is shared: every rank sees every key
    store.wait([f"key{q}" for q in range(dist.get_world_size())])


def test_fcoll_url(fresh: None) -> None:
    n, r = fc.get_world_size(), fc.get_rank()
    dist.init_process_group("fcoll", init_method="fcoll://", rank=r, world_size=n)
    works()
    dist.barrier()
    dist.destroy_process_group()
    with pytest.raises(ValueError, match=rf"expected rank {r} and world_size {n} \(MPI's\)"):
        dist.init_process_group("fcoll", init_method="fcoll://", rank=r, world_size=n + 1)


def _free_port() -> int:
    port = 0
    if fc.get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return int(fc.broadcast_object(port, 0))


def test_torchrun_variables(fresh: None) -> None:
    n, r = fc.get_world_size(), fc.get_rank()
    os.environ.update(RANK=str(r), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    dist.init_process_group("fcoll")
    works()
    dist.barrier()
    dist.destroy_process_group()
    if n > 1:  # ranks that disagree with MPI's: every rank says so
        os.environ.update(RANK=str((r + 1) % n), MASTER_PORT=str(_free_port()))
        with pytest.raises(RuntimeError, match=rf"takes rank and world size from MPI \(rank {r} "
                                               rf"of {n}\), but torch was given rank {(r + 1) % n}"):
            dist.init_process_group("fcoll")
    os.environ.pop("MASTER_ADDR")
    with pytest.raises(ValueError, match="MASTER_ADDR expected, but not set"):
        dist.init_process_group("fcoll")


def test_pg_options_are_refused(fresh: None) -> None:
    with pytest.raises(TypeError, match="expected pg_options=None"):
        dist.init_process_group("fcoll", pg_options=object())


def test_entry_point_registers() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    value = pyproject["project"]["entry-points"]["torch.distributed.backends"]["fcoll"]
    register = EntryPoint("fcoll", value, "torch.distributed.backends").load()
    register()
    register()  # idempotent
    assert "fcoll" in dist.Backend.backend_list and dist.Backend.backend_capability["fcoll"] == \
        ["cpu", "cuda"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # fcoll takes no default
