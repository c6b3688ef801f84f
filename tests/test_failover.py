"""Failover decisions, without sockets: which endpoint next, and what each outcome means."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from supervisor.aclient import AsyncClient
from supervisor.client import Client
from supervisor.client.errors import NoReply
from supervisor.client.failover import Attempt, Rotation
from supervisor.shared.protocol import RESULT, Message, error_message
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor
from tests.conftest import echo_model

ENDPOINTS = ["tcp://a:1", "tcp://b:1", "tcp://c:1"]


def test_each_endpoint_is_tried_once_healthy_ones_first() -> None:
    rotation = Rotation(ENDPOINTS)
    rotation.mark_down("tcp://a:1")
    attempt = Attempt(rotation, retry_unanswered=True, timeout=1.0)
    tried = list(attempt.endpoints())
    assert sorted(tried) == sorted(ENDPOINTS) and tried[-1] == "tcp://a:1"


def test_round_robin_spreads_first_choices() -> None:
    rotation = Rotation(ENDPOINTS)
    firsts = {next(Attempt(rotation, True, 1.0).endpoints()) for _ in range(3)}
    assert firsts == set(ENDPOINTS)


def test_a_refusal_moves_on_and_is_the_answer_if_everyone_refuses() -> None:
    attempt = Attempt(Rotation(ENDPOINTS), True, 1.0)
    refusals = [error_message(b"j", "overloaded", f"full {i}") for i in range(3)]
    for endpoint, refusal in zip(attempt.endpoints(), refusals, strict=True):
        assert not attempt.answered(endpoint, refusal)
    assert attempt.outcome() is refusals[-1]


def test_results_and_final_errors_are_answers() -> None:
    attempt = Attempt(Rotation(ENDPOINTS), True, 1.0)
    assert attempt.answered("tcp://a:1", Message(RESULT, b"j"))
    assert attempt.answered("tcp://a:1", error_message(b"j", "bad_request", "no"))


def test_a_lost_job_is_retried_only_when_allowed() -> None:
    Attempt(Rotation(ENDPOINTS), True, 1.0).lost("tcp://a:1")
    with pytest.raises(NoReply, match="may have run"):
        Attempt(Rotation(ENDPOINTS), False, 1.0).lost("tcp://a:1")


def test_nobody_reachable_is_no_reply() -> None:
    attempt = Attempt(Rotation(ENDPOINTS), True, 2.0, deadline=time.monotonic())
    for endpoint in attempt.endpoints():
        attempt.not_sent(endpoint)
    with pytest.raises(NoReply, match="no supervisor reachable"):
        attempt.outcome()


def test_when_nobody_could_be_reached_it_goes_round_again_until_the_deadline() -> None:
    # A script started together with its supervisor: no connection yet anywhere. Each try
    # waits up to CONNECT_WAIT for one (sockets do; here the round is told not_sent at once).
    attempt = Attempt(Rotation(ENDPOINTS), True, 60.0)
    tried = list(itertools.islice(_not_sent_each(attempt), 7))
    assert sorted(tried[:3]) == sorted(ENDPOINTS) == sorted(tried[3:6])


def test_no_new_round_after_a_refusal_or_a_lost_job() -> None:
    refused = Attempt(Rotation(ENDPOINTS), True, 60.0)
    for i, endpoint in enumerate(refused.endpoints()):
        if i == 0:
            assert not refused.answered(endpoint, error_message(b"j", "overloaded", "full"))
        else:
            refused.not_sent(endpoint)
    assert len(refused.tried) == 3
    lost = Attempt(Rotation(ENDPOINTS), True, 60.0)
    for i, endpoint in enumerate(lost.endpoints()):
        lost.lost(endpoint) if i == 0 else lost.not_sent(endpoint)
    assert len(lost.tried) == 3


def _not_sent_each(attempt: Attempt) -> Iterator[str]:
    for endpoint in attempt.endpoints():
        attempt.not_sent(endpoint)
        yield endpoint


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
def test_a_client_started_before_its_supervisor_is_served_once_it_is_up(kind: str) -> None:
    workdir = short_tmpdir()
    endpoint = f"ipc://{workdir}/run/frontend.sock"
    started: list[Supervisor] = []

    def later() -> None:
        time.sleep(2.5)  # more than CONNECT_WAIT: the first round finds no one
        started.append(start_supervisor({"models": {"m": echo_model(1)}}, workdir=workdir))

    thread = threading.Thread(target=later)
    thread.start()
    try:
        x = {"x": np.ones((1, 4), np.float32)}
        if kind == "Client":
            with Client(endpoint, timeout=60) as client:
                out = client.infer("m", x)
        else:
            async def call() -> dict[str, np.ndarray]:
                async with AsyncClient(endpoint, timeout=60) as client:
                    return await client.infer("m", x)
            out = asyncio.run(call())
        assert out["x"].tolist() == [[1.0] * 4]
    finally:
        thread.join()
        for sup in started:
            sup.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_closing_an_async_client_ends_its_calls_at_once_and_quietly() -> None:
    """A call still out when its AsyncClient is closed ends at once with NoReply, not at its
    timeout (nothing can answer it) and not with a raw ZMQError; a read or watch the loop
    had scheduled for the closed socket does nothing (it raised 'Socket operation on
    non-socket' in the loop's exception handler)."""
    workdir = short_tmpdir()
    endpoint = f"ipc://{workdir}/nobody.sock"  # no supervisor: the call waits to connect

    async def main() -> None:
        errors: list[object] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        for turns in (0, 5):  # closed in the link's first turn, and later
            client = AsyncClient(endpoint, timeout=30)
            call = asyncio.create_task(client.infer("m", {"x": np.ones((1, 4), np.float32)}))
            for _ in range(turns + 1):
                await asyncio.sleep(0)
            started = time.monotonic()
            await client.close()
            with pytest.raises(NoReply, match="closed"):
                await call
            assert time.monotonic() - started < 1
        await asyncio.sleep(0.05)
        assert errors == []

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
