"""The control plane cannot slow the jobs (issue 47, item 2): status is answered from what
the loop publishes, and each connection to the status endpoint is paced, with the pacing
counted in status and in metrics. Real daemon, real sockets; the figures of a flood against
jobs are bench/control_flood.py's, not a timed test's."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from supervisor.client import control
from supervisor.daemon.pacing import CONTROL_BURST, HELD_PER_CALLER
from supervisor.shared.protocol import CONTROL, Message, decode, encode
from supervisor.testing import Supervisor
from tests.conftest import echo_model


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_answers_what_is_true_after_an_admin_command(
        supervisor_factory: Callable[..., Supervisor]) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    sent = sup.status()["models"]["m"]["batches"]["sent"]
    with sup.client() as client:
        for _ in range(3):
            client.infer("m", {"x": np.ones((1, 4), np.float32)})
    # Nothing floods the endpoint: each status is built in its own turn, never an old one.
    assert sup.status()["models"]["m"]["batches"]["sent"] >= sent + 3
    worker = sup.workers("m")[0]
    assert worker["state"] == "ready" and sup.status()["models"]["m"]["available"]
    sup.admin("recycle", model="m", worker=worker["id"])
    # At once, though a status was published a moment ago: an admin command starts anew.
    again = {w["id"]: w for w in sup.workers("m")}
    assert again[worker["id"]]["recycle_requested"] is not None or \
        again[worker["id"]]["state"] != "ready", again


def test_a_flooding_connection_is_paced_and_others_are_still_answered(
        supervisor_factory: Callable[..., Supervisor]) -> None:
    port = _port()
    sup = supervisor_factory({"supervisor": {"metrics": f"127.0.0.1:{port}"},
                              "models": {"m": echo_model(1)}})
    flood = 3 * (CONTROL_BURST + HELD_PER_CALLER)
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.connect(sup.control_endpoint)
    try:
        request = encode(Message(CONTROL, b"", {"command": "status"}))
        for _ in range(flood):  # pipelined, never waiting for an answer
            sock.send_multipart(request)
        replies: list[dict[str, Any]] = []
        while len(replies) < flood:  # every request answered, the held ones later
            assert sock.poll(30_000), f"{len(replies)} of {flood} answered"
            replies.append(decode(sock.recv_multipart()).header)
            if len(replies) == CONTROL_BURST:  # another caller meanwhile: answered
                assert control(sup.control_endpoint, "status")["models"]["m"]
    finally:
        sock.close(linger=0)
    answered = [r for r in replies if r["ok"]]
    refused = [r for r in replies if not r["ok"]]
    assert answered and all(r["result"]["models"]["m"]["workers"] for r in answered)
    assert refused and all("too many requests waiting" in r["error"] for r in refused)
    paced = sup.status()["supervisor"]["control_paced"]
    assert paced["delayed"] >= 1 and paced["refused"] == len(refused), paced
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    assert f'tfsupervisor_control_requests_paced_total{{outcome="refused"}} ' \
           f'{float(len(refused))}' in text
    assert 'tfsupervisor_control_requests_paced_total{outcome="delayed"}' in text


def test_a_caller_on_a_new_connection_each_time_is_paced_by_the_total() -> None:
    """A fresh connection has a fresh bucket: the total bounds them all together."""
    from supervisor.daemon.pacing import CONTROL_TOTAL_BURST, CONTROL_TOTAL_RATE, Pacer

    now = [0.0]
    pacer = Pacer(lambda: now[0])
    outcomes = [pacer.admit(str(i).encode(), [b"x"]) for i in range(CONTROL_TOTAL_BURST + 5)]
    assert outcomes.count("now") == CONTROL_TOTAL_BURST and outcomes.count("held") == 5
    assert pacer.due() == [] and pacer.next_due() == 1 / CONTROL_TOTAL_RATE
    now[0] += 5 / CONTROL_TOTAL_RATE
    assert len(pacer.due()) == 5 and not pacer.held and pacer.holding == 0
    assert pacer.facts()["delayed"] == 5 and pacer.facts()["refused"] == 0
