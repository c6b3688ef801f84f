"""The clients' per-call path against a scripted server: reply headers remembered only where
nothing the caller holds can share them."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from supervisor.aclient import AsyncClient
from supervisor.client import Client
from supervisor.client import client as client_module
from supervisor.shared.protocol import (
    INFER,
    MODELS,
    RESULT,
    HeaderMemo,
    Message,
    decode,
    encode,
)
from supervisor.testing import short_tmpdir

MODELS_HEADER = {"models": {"m": {"inputs": [{"name": "x", "dtype": "float32",
                                                "shape": [None, 4]}], "ready": 1}}}


class Scripted:
    """A ROUTER in a thread answering like a supervisor: an echo of each job's arrays as its
    RESULT (header {"outputs": the request's inputs}), the same MODELS reply every time. It
    counts the jobs it got."""

    def __init__(self) -> None:
        self.dir = short_tmpdir()
        self.endpoint = f"ipc://{self.dir}/scripted.sock"
        self.jobs: list[bytes] = []
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            peer, *frames = self._sock.recv_multipart()
            msg = decode(frames)
            if msg.kind == INFER:
                self.jobs.append(msg.job_id)
                reply = Message(RESULT, msg.job_id, {"outputs": msg.header["inputs"]},
                                msg.arrays)
            else:
                reply = Message(MODELS, msg.job_id, MODELS_HEADER)
            self._sock.send_multipart([peer, *encode(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    server = Scripted()
    try:
        yield server
    finally:
        server.close()


def shapes() -> list[tuple[int, ...]]:
    """Shapes repeated in a random order: replies whose headers repeat, and new ones."""
    rng = random.Random(7)
    return [rng.choice([(1, 4), (2, 4), (3,), (2, 2, 2), (0, 4)]) for _ in range(60)]


def test_remembered_job_replies_give_what_parsing_gives(scripted: Scripted) -> None:
    """Each call of a shape seen before takes its reply header from the memo: its outputs
    are still its own arrays; the memo stays within its bound."""
    with Client(scripted.endpoint, timeout=10) as client:
        for i, shape in enumerate(shapes()):
            data = np.full(shape, float(i), np.float32)
            out = client.infer("m", {"x": data})
            assert out["x"].dtype == np.float32
            np.testing.assert_array_equal(out["x"], data)
    memo = client_module.job_replies
    assert msgpack.packb({"outputs": [{"name": "x", "dtype": "float32", "shape": [1, 4]}]}) \
        in memo.headers
    assert len(memo.headers) <= HeaderMemo.MAX_ENTRIES


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
def test_models_replies_are_the_callers_own(scripted: Scripted, kind: str) -> None:
    """The same MODELS reply twice: what the first call returned, changed by its caller,
    changes nothing the second returns (a models() reply is never shared with a memo)."""
    async def both() -> list[dict[str, Any]]:
        async with AsyncClient(scripted.endpoint, timeout=10) as client:
            return [await client.models(), await client.models()]

    if kind == "Client":
        with Client(scripted.endpoint, timeout=10) as sync:
            first = sync.models()
            first["m"]["inputs"].clear()
            first["m"]["ready"] = 0
            second = sync.models()
    else:
        first, second = asyncio.run(both())
        first["m"]["inputs"].clear()
        first["m"]["ready"] = 0
        async def again() -> dict[str, Any]:
            async with AsyncClient(scripted.endpoint, timeout=10) as client:
                return await client.models()
        second = asyncio.run(again())
    assert second == MODELS_HEADER["models"]
