"""A 2-D FFT of an array split into slabs of rows, with `fc.all_to_all_single` transposes.

    mpiexec -n 4 .venv/bin/python -m fcoll.run examples/fft2.py [--rows 96] [--cols 120] [--repeat 21]

Each rank holds a slab of rows of the global array (uneven where the rows do not divide).
A 2-D FFT is a 1-D FFT along each axis: first along the rows this rank holds whole; then an
all-to-all gives every rank a slab of columns (rank j's rows of this rank's columns
arrive from rank j), where the 1-D FFT along the other axis runs; a second all-to-all puts
the result back into slabs of rows. Split sizes differ between ranks, so the blocks travel
flat with their sizes (``input_split_sizes``/``output_split_sizes``). Every rank checks
its slab against ``numpy.fft.fft2`` of the whole array, and times the transform against the
same one written with raw mpi4py (``comm.Alltoallv`` with counts and offsets), the
median of ``--repeat`` runs each, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import fcoll as fc


def bounds(length: int, parts: int, i: int) -> tuple[int, int]:
    """Block ``i`` of ``length`` split into ``parts`` (the first ones one larger)."""
    base, extra = divmod(length, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


def transpose(block: np.ndarray, split_cols: list[tuple[int, int]], rows_of: list[int]
              ) -> np.ndarray:
    """Rows-slab ``block`` (this rank's rows, every column) to a columns-slab (every row,
    this rank's columns): column block ``j`` goes to rank ``j``; ``rows_of[j]`` is how many
    rows rank ``j`` holds."""
    me = fc.get_rank()
    mine = split_cols[me][1] - split_cols[me][0]
    send = np.concatenate([block[:, a:b].ravel() for a, b in split_cols])
    got = fc.all_to_all_single(send, [rows * mine for rows in rows_of],
                               [block.shape[0] * (b - a) for a, b in split_cols])
    return got.reshape(sum(rows_of), mine)


def raw_transpose(block: np.ndarray, split_cols: list[tuple[int, int]], rows_of: list[int]
                  ) -> np.ndarray:
    """`transpose` with raw mpi4py, as a careful user writes it: ``Alltoallv`` of the packed
    blocks with counts and offsets (complex128 elements)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    mine = split_cols[me][1] - split_cols[me][0]
    send = np.concatenate([block[:, a:b].ravel() for a, b in split_cols])
    sends = [block.shape[0] * (b - a) for a, b in split_cols]
    recvs = [rows * mine for rows in rows_of]
    got = np.empty(sum(recvs), block.dtype)
    comm.Alltoallv([send, (sends, np.cumsum([0, *sends[:-1]]).tolist()), MPI.C_DOUBLE_COMPLEX],
                   [got, (recvs, np.cumsum([0, *recvs[:-1]]).tolist()), MPI.C_DOUBLE_COMPLEX])
    return got.reshape(sum(rows_of), mine)


def fft2(slab: np.ndarray, rows: int, cols: int, move: Any = transpose) -> np.ndarray:
    """The 2-D FFT of the distributed array whose row slab on this rank is ``slab``; the
    result as the same row slab (``move``: the transpose, fcoll's or `raw_transpose`)."""
    n = fc.get_world_size()
    row_blocks = [bounds(rows, n, j) for j in range(n)]
    col_blocks = [bounds(cols, n, j) for j in range(n)]
    along_rows = np.fft.fft(slab, axis=1)
    columns = move(along_rows, col_blocks, [b - a for a, b in row_blocks])
    along_columns = np.fft.fft(columns, axis=0)
    # back: this rank's columns (every row) -> its rows (every column), the same exchange
    back = move(along_columns.T.copy(), row_blocks, [b - a for a, b in col_blocks])
    return back.T.copy()


def run(rows: int = 96, cols: int = 120, repeat: int = 1) -> tuple[float, float, float]:
    """The FFT of a random array (the same on every rank): ``(seconds, raw mpi4py's seconds,
    max error)``, the times medians over ``repeat`` interleaved runs (the slowest rank's),
    the error against numpy.fft.fft2 of the whole array, relative to its largest entry."""
    n, me = fc.get_world_size(), fc.get_rank()
    whole = np.random.default_rng(0).standard_normal((rows, cols)) + 0j
    a, b = bounds(rows, n, me)
    times: dict[Any, list[float]] = {transpose: [], raw_transpose: []}
    for _ in range(repeat):
        for move in times:
            fc.barrier()
            start = time.perf_counter()
            mine = fft2(whole[a:b], rows, cols, move)
            took = fc.all_reduce(np.array(time.perf_counter() - start), "max")
            times[move].append(float(took[()]))
    expected = np.fft.fft2(whole)
    err = float(np.max(np.abs(mine - expected[a:b]), initial=0.0)) / float(np.max(np.abs(expected)))
    return (statistics.median(times[transpose]), statistics.median(times[raw_transpose]),
            float(fc.all_reduce(np.array(err), "max")[()]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--cols", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    seconds, raw, err = run(args.rows, args.cols, args.repeat)
    if fc.get_rank() == 0:
        print(f"fft2: {args.rows}x{args.cols} in slabs over {fc.get_world_size()} ranks: "
              f"fcoll {seconds * 1e3:.3f} ms, raw mpi4py {raw * 1e3:.3f} ms (fcoll/raw "
              f"{seconds / raw:.2f}), max error against numpy.fft.fft2 {err:.2e}")


if __name__ == "__main__":
    main()
