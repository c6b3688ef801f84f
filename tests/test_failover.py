"""Failover decisions, without sockets: which endpoint next, and what each outcome means."""

from __future__ import annotations

import pytest

from supervisor.errors import NoReply
from supervisor.failover import Attempt, Rotation
from supervisor.protocol import RESULT, Message, error_message

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
    attempt = Attempt(Rotation(ENDPOINTS), True, 2.0)
    for endpoint in attempt.endpoints():
        attempt.not_sent(endpoint)
    with pytest.raises(NoReply, match="no supervisor reachable"):
        attempt.outcome()
