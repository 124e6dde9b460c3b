"""fcoll.calls.engine: one job at a time, in issue order; callbacks' jobs first; waits that
run queued jobs; inline calls after the queue (issue 41). Pure Python jobs: no MPI."""

from __future__ import annotations

import threading
import time

import pytest

from fcoll import runtime
from fcoll.calls.engine import Engine, Job


def test_jobs_run_in_issue_order_one_at_a_time() -> None:
    e, seen, active = Engine(), [], [0]

    def job(name: str) -> Job:
        def run() -> str:
            active[0] += 1
            assert active[0] == 1  # never two at once
            time.sleep(0.001)
            seen.append(name)
            active[0] -= 1
            return name
        return e.submit(run)

    jobs = [job(f"j{i}") for i in range(20)]
    e.wait(jobs[-1])
    assert seen == [f"j{i}" for i in range(20)] and all(j.finished for j in jobs)
    assert jobs[3].result() == "j3"
    e.drain()


def test_a_failed_job_raises_in_its_waiter_and_the_engine_goes_on() -> None:
    e = Engine()
    bad = e.submit(lambda: 1 / 0)
    good = e.submit(lambda: 7)
    e.wait(good)
    with pytest.raises(ZeroDivisionError):
        bad.result()
    assert good.result() == 7
    e.drain()


def test_inline_runs_after_the_queue() -> None:
    e, seen = Engine(), []
    gate = threading.Event()
    e.submit(lambda: (gate.wait(5), seen.append("queued")))
    threading.Timer(0.05, gate.set).start()
    e.inline(lambda: seen.append("inline"))
    assert seen == ["queued", "inline"]
    e.drain()


def test_callbacks_jobs_run_before_later_jobs_of_other_threads() -> None:
    """PowerSGD's shape: a job's callback issues a job and blocks on it, while the issuing
    thread has already queued the next job: the callback's job runs first."""
    e, seen = Engine(), []
    gate = threading.Event()

    def callback(job: Job) -> None:
        inner = e.submit(lambda: seen.append(f"{job.value}.cb"))
        while not inner.finished:  # a blocking wait on a future another thread completes
            time.sleep(0.001)
        seen.append(f"{job.value}.cb done")

    first = e.submit(lambda: (gate.wait(5), seen.append("a"))[1] or "a", callback)
    second = e.submit(lambda: seen.append("b") or "b", callback)
    gate.set()
    e.wait(second)
    while e.busy():
        time.sleep(0.001)
    assert seen == ["a", "a.cb", "a.cb done", "b", "b.cb", "b.cb done"], seen
    assert first.finished
    e.drain()


def test_wait_runs_queued_jobs_in_the_waiting_thread() -> None:
    e = Engine()
    with e._cv:  # hold the engine threads back: the waiter takes its job itself
        job = Job(lambda: threading.current_thread().name)
        e._queue.append(job)
        e.last = job
    e.wait(job)
    assert job.value == threading.current_thread().name and e.ran["caller"] == 1


def test_the_eager_wait_is_set_while_jobs_are_pending_and_taken_off_after() -> None:
    e = Engine()
    job = e.submit(lambda: None)
    assert e.drain in runtime._BEFORE
    e.wait(job)
    e.drain()
    assert e.drain not in runtime._BEFORE


def test_after_fork_the_engine_is_empty() -> None:
    e = Engine()
    e.wait(e.submit(lambda: None))
    e._after_fork()
    assert not e.busy() and e._threads == 0 and e.last is None
    assert e.wait(e.submit(lambda: 5)) is None  # a new thread starts
    e.drain()
