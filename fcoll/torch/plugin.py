"""Registration of the backend ``"fcoll"`` with torch.distributed, and its start-up.

`register` (run by ``import fcoll.torch``, and by torch 2.14's ``torch.distributed.backends``
entry point without that import, which torch 2.14.1 loads after its rendezvous: so the
``env://`` fallback below needs the import) registers the backend for CPU and CUDA tensors,
puts `fcoll.torch.backend.monitored_barrier` in place of ``dist.monitored_barrier``,
the rendezvous ``fcoll://``, and a fallback for torch's default ``env://``:

- ``fcoll://`` takes rank and world size from MPI (``mpiexec``, ``srun``: no variable to
  set) and makes torch's key-value store: a ``TCPStore`` served by rank 0 (its port chosen
  by the system and broadcast over MPI; ``127.0.0.1`` when every rank is on one node), a
  ``HashStore`` in a job of one process;
- ``env://`` with none of ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set
  (so torch's handler would fail) goes to ``fcoll://``; with any of them set, torch's own
  handler runs, and says which variable is missing. So ``init_process_group("fcoll")``
  needs no argument under ``mpiexec``, and torchrun-style variables still work when the
  processes are also one MPI job (the backend checks that RANK and WORLD_SIZE match MPI's).

Example:
    >>> import fcoll.torch                       # runs register()
    >>> dist.init_process_group("fcoll")         # mpiexec -n 4 python train.py
    >>> dist.get_world_size()
    4
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable, Iterator
from importlib import import_module
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from fcoll import collectives
from fcoll.groups.group import world as world_group
from fcoll.torch.backend import NAME, create, monitored_barrier

# The module (torch.distributed.rendezvous the attribute is its function of that name).
torch_rendezvous: Any = import_module("torch.distributed.rendezvous")
SCHEME = "fcoll"
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def register() -> None:
    """Register the backend ``"fcoll"`` (CPU and CUDA tensors), ``fcoll://`` and the
    ``env://`` fallback with torch.distributed; idempotent. torch 2.14 finds it through
    the ``torch.distributed.backends`` entry point.

    Example:
        >>> register(); "fcoll" in dist.Backend.backend_list
        True
    """
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
    handlers = torch_rendezvous._rendezvous_handlers
    if SCHEME not in handlers:
        torch_rendezvous.register_rendezvous_handler(SCHEME, rendezvous)
    env = handlers.get("env")
    if env is not None and not getattr(env, "fcoll_fallback", False):
        handlers["env"] = _env_or_mpi(env)
    # torch's monitored_barrier refuses every backend but gloo by name: this one takes
    # "fcoll" groups too and hands the others to torch's.
    dist.monitored_barrier = monitored_barrier
    dist.distributed_c10d.monitored_barrier = monitored_barrier


def _query(url: str) -> dict[str, int]:
    return {k: int(v[-1]) for k, v in parse_qs(urlparse(url).query).items()
            if k in ("rank", "world_size")}


def rendezvous(url: str, timeout: datetime.timedelta = default_pg_timeout,
               **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """torch's rendezvous ``fcoll://``: this process's MPI rank and the job's size, and a store
    every rank shares; collective over the job. A ``rank``/``world_size`` in the URL (torch
    adds the ones passed to ``init_process_group``) must equal MPI's.

    Example:
        >>> store, rank, size = next(rendezvous("fcoll://"))   # every rank of mpiexec -n 2
        >>> rank, size                                         # on rank 1
        (1, 2)
    """
    world = world_group()
    asked = _query(url)
    if asked.get("rank", world.rank) != world.rank or \
            asked.get("world_size", world.size) != world.size:
        raise ValueError(f"init_process_group: expected rank {world.rank} and world_size "
                         f"{world.size} (MPI's) or none, got rank {asked.get('rank')} and "
                         f"world_size {asked.get('world_size')}")
    yield _store(timeout), world.rank, world.size
    raise RuntimeError("fcoll:// rendezvous: a job cannot re-rendezvous; start a new one")


def _store(timeout: datetime.timedelta) -> Any:
    """torch's key-value store for the job: rank 0 serves a ``TCPStore`` on a port the system
    picks, every rank learns where through MPI and connects before any returns."""
    world = world_group()
    if world.size == 1:
        return dist.HashStore()  # type: ignore[attr-defined]  # torch's stubs omit the stores
    hosts = collectives.all_gather_object(socket.gethostname())
    host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    server = None
    if world.rank == 0:
        server = dist.TCPStore(host, 0, world.size, is_master=True,  # type: ignore[attr-defined]
                               timeout=timeout, wait_for_workers=False)
    port = collectives.broadcast_object(server.port if server is not None else 0, 0)
    store = server if server is not None else \
        dist.TCPStore(host, port, world.size, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
    collectives.barrier()  # every client has connected before rank 0 may go on (and end its server)
    return store


def _env_or_mpi(env: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``env://`` handler, falling back to ``fcoll://`` when none of its variables
    is set (where it would fail)."""

    def handler(url: str, **kwargs: Any) -> Any:
        if any(os.environ.get(v) for v in TORCHRUN_VARIABLES):
            return env(url, **kwargs)
        return rendezvous(f"{SCHEME}://?{urlparse(url).query}", **kwargs)

    handler.fcoll_fallback = True  # type: ignore[attr-defined]
    return handler
