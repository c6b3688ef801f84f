"""Worker stdout/stderr under JSON logs (supervisor/daemon/worker_output.py): the pure line
splitter, classifier and rate limit with the time passed in, the pipes on real file descriptors, and
a live supervisor whose workers print junk, flood and crash."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import structlog
import zmq

from supervisor.client import JobError
from supervisor.daemon import worker_output as output
from supervisor.daemon.worker_output import (
    BURST,
    MAX_LINE,
    REPORT_PERIOD,
    TAIL_LINES,
    TEXT_LIMIT,
    Line,
    LineSplitter,
    OutputStream,
    Passthrough,
    Suppressed,
    Text,
    TokenBucket,
    WorkerOutput,
    level_of,
    own_event,
    text_record,
)
from tests import output_handlers
from tests.conftest import Supervisor

W = "m-1"


def event(worker: str = W, **fields: Any) -> bytes:
    return json.dumps({"event": "something", "worker": worker, **fields}).encode()


def texts(records: list[Any]) -> list[str]:
    return [r.line for r in records if isinstance(r, Text)]


# --- line splitting ------------------------------------------------------------------------

def test_lines_are_split_across_reads_and_the_partial_one_waits() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntw") == ([b"one"], {})
    assert splitter.feed(b"o") == ([], {})
    assert splitter.feed(b"o\n\nthr") == ([b"twoo", b""], {})
    assert splitter.flush() == Line(b"thr", 3)
    assert splitter.flush() is None
    assert splitter.feed(b"") == ([], {})


def test_a_long_line_is_kept_up_to_the_limit_and_counted_in_full() -> None:
    splitter = LineSplitter(limit=10)
    assert splitter.feed(b"0123456") == ([], {})
    assert splitter.feed(b"789abcdef") == ([], {})
    assert splitter.feed(b"ghi\nnext\n") == ([b"0123456789", b"next"], {0: 19})
    # a long line inside one read is cut too, and so is an unfinished one at the end
    assert splitter.feed(b"ok\n" + b"x" * 25 + b"\n" + b"y" * 12) == ([b"ok", b"x" * 10],
                                                                      {1: 25})
    assert splitter.flush() == Line(b"y" * 10, 12)


# --- classification ------------------------------------------------------------------------

def test_only_this_workers_own_events_pass_through_unchanged() -> None:
    own = event(level="info", nested={"a": [1, 2]})
    assert own_event(Line(own, len(own)), W) == own.decode()
    assert own_event(Line(own + b"\r", len(own) + 1), W) == own.decode()
    for line in (event(worker="m-2"),  # another worker's name: not proven
                 b'{"worker": "m-1"}',  # no event
                 b'{"event": 3, "worker": "m-1"}',
                 b'[{"event": "x", "worker": "m-1"}]',  # not an object
                 b'{"event": "x", "worker": "m-1", "loss": NaN}',  # jq refuses NaN
                 b'{"event": "x", "worker": "m-1", "v": "\xff"}',  # not UTF-8
                 b'{"event": "x", "worker": "m-1"',  # cut
                 b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested past recursion
                 b"plain text"):
        assert own_event(Line(line, len(line)), W) is None, line[:60]
    cut = event(pad="y" * 100)
    assert own_event(Line(cut[:50], len(cut)), W) is None


def test_text_shows_undecodable_bytes_and_marks_a_cut_line() -> None:
    record = text_record(Line(b"bad \xff\xfe bytes\r", 14))
    assert record == Text("bad \\xff\\xfe bytes", "warning", 14, False)
    assert not record.truncated
    long = text_record(Line(b"z" * MAX_LINE, 1_000_000))
    assert long.truncated and long.size == 1_000_000
    assert long.line == "z" * TEXT_LIMIT + "…"


@pytest.mark.parametrize(("line", "level"), [
    (b"I0000 00:00:1796293910.835071    9730 port.cc:153] oneDNN custom operations", "info"),
    (b"W0513 12:01:02.123456  1 cuda.cc:9] slow", "warning"),
    (b"E0000 00:00:1.5 7 x.cc:1] failed", "error"),
    (b"F0000 00:00:1712345678.123456 4242 op_kernel.cc:99] Check failed: dims", "error"),
    (b"WARNING:tensorflow:5 out of the last 5 calls triggered tf.function retracing", "warning"),
    (b"INFO:root:hello", "info"),
    (b"Traceback (most recent call last):", "warning"),
    (b"Fine 0000", "warning"),
])
def test_levels_follow_absl_and_python_logging_prefixes(line: bytes, level: str) -> None:
    assert level_of(line) == level


# --- rate limit ----------------------------------------------------------------------------

def test_token_bucket_gives_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(4)] == [1, 1, 1, 0]
    assert bucket.take(100.4) == 0  # 0.8 of a token
    assert bucket.take(100.5) == 1
    assert bucket.take(200.0, count=5) == 3  # capped at the burst: some of them
    assert bucket.take(200.0, count=5) == 0
    assert bucket.take(201.0, count=5) == 2


def test_a_flood_is_limited_counted_and_reported_once_per_period() -> None:
    stream = OutputStream(W, now=0.0)
    flood = b"".join(f"line {i}\n".encode() for i in range(10_000))
    records = stream.feed(flood, now=0.0)
    assert len(records) == BURST  # no report yet: the first is due one period on
    assert texts(records)[-1] == f"line {BURST - 1}"
    assert stream.tick(REPORT_PERIOD - 0.1) == []
    report = stream.tick(REPORT_PERIOD)
    assert report == [Suppressed(10_000 - BURST - TAIL_LINES)]  # the tail is held, not lost
    assert stream.tick(REPORT_PERIOD + 0.1) == []  # reported once
    # The bucket refilled meanwhile: the next lines pass, and the held tail is lost now.
    records = stream.feed(b"after\n", now=REPORT_PERIOD + 1)
    assert texts(records) == ["after"]
    # Lost lines are reported once a period at most, not at every loss.
    assert stream.tick(REPORT_PERIOD + 2) == []
    assert stream.tick(2 * REPORT_PERIOD + 1) == [Suppressed(TAIL_LINES)]


def test_the_last_lines_held_back_are_logged_when_the_stream_ends() -> None:
    stream = OutputStream(W, now=0.0)
    stream.feed(b"spam\n" * (BURST + 100), now=0.0)
    crash = [b"Traceback (most recent call last):", b'  File "x.py", line 1', b"boom"]
    stream.feed(b"\n".join(crash) + b"\nF0000 00:00:1.0 1 a.cc:1] Check failed", now=0.0)
    records = stream.finish(now=0.0)
    # 100 spam, 3 lines and the partial one (flushed at the end) went over the budget; the
    # last TAIL_LINES of them are logged, the others counted.
    assert isinstance(records[0], Suppressed)
    held = [r for r in records[1:] if isinstance(r, Text)]
    assert len(held) == TAIL_LINES and all(r.tail for r in held)
    assert [r.line for r in held[-4:]] == [*(c.decode() for c in crash),
                                           "F0000 00:00:1.0 1 a.cc:1] Check failed"]
    assert held[-1].level == "error"
    logged = BURST + TAIL_LINES
    assert records[0].dropped == BURST + 100 + 4 - logged  # every line accounted for
    assert stream.finish(now=1.0) == []


def test_own_events_have_their_own_budget_and_keep_their_place() -> None:
    stream = OutputStream(W, now=0.0)
    stream.feed(b"junk\n" * (BURST * 3), now=0.0)
    records = stream.feed(event() + b"\n", now=0.0)
    assert records == [Passthrough(event().decode())]
    stream = OutputStream(W, now=0.0)
    records = stream.feed(b"a\n" + event(n=1) + b"\nb\n" + event(worker="m-2") + b"\n"
                          + b'{"event": "x", "pad": "' + b"p" * 70_000 + b'", "worker": "m-1"}\n'
                          + event(n=2)[:9], now=0.0)
    records += stream.feed(event(n=2)[9:] + b"\nc", now=0.0)  # the id straddles two reads
    records += stream.finish(now=0.0)
    assert [type(r).__name__ for r in records] == ["Text", "Passthrough", "Text", "Text",
                                                    "Text", "Passthrough", "Text"]
    assert records[1] == Passthrough(event(n=1).decode())
    assert records[5] == Passthrough(event(n=2).decode())
    cut = records[4]
    assert isinstance(cut, Text) and cut.truncated and cut.size > MAX_LINE  # too long to pass
    assert texts(records)[:3] == ["a", "b", event(worker="m-2").decode()]
    assert texts(records)[-1] == "c"


def test_own_events_past_their_budget_are_counted_unparsed() -> None:
    stream = OutputStream(W, now=0.0)
    lookalikes = b'{"note": "m-1"}\n' * 3  # hold the id, are not events: text
    records = stream.feed(lookalikes + (event() + b"\n") * (BURST + 5), now=0.0)
    assert texts(records) == ['{"note": "m-1"}'] * 3
    assert sum(isinstance(r, Passthrough) for r in records) == BURST  # tokens given back
    assert stream.finish(now=1.0) == [Suppressed(5)]


# --- the pipes -----------------------------------------------------------------------------

@pytest.fixture
def pipes() -> Iterator[WorkerOutput]:
    out = WorkerOutput()
    yield out
    out.finish_all(0.0)


def test_pipes_are_read_when_ready_and_drained_when_the_worker_is_gone(
        pipes: WorkerOutput, capsys: pytest.CaptureFixture[str]) -> None:
    poller = zmq.Poller()
    pipes.attach(poller)
    write = pipes.open(W, "m", now=0.0)
    try:
        os.write(write, b"hello\n" + event() + b"\npart")
        with structlog.testing.capture_logs() as logged:
            pipes.read(dict(poller.poll(1000)), now=0.0)
            os.write(write, b"ial\n" + b"end without newline")
            pipes.finish(W, now=1.0)  # reaped: what is left is read, the rest flushed
    finally:
        os.close(write)
    assert [(e["event"], e["line"], e["worker"], e["model"]) for e in logged] == [
        ("worker_output", "hello", W, "m"),
        ("worker_output", "partial", W, "m"),
        ("worker_output", "end without newline", W, "m")]
    assert capsys.readouterr().err == event().decode() + "\n"
    assert poller.poll(0) == []  # unregistered and closed


def test_end_of_stream_closes_the_pipe_at_once(pipes: WorkerOutput) -> None:
    poller = zmq.Poller()
    pipes.attach(poller)
    os.close(pipes.open(W, "m", now=0.0))  # the worker exited, nothing written
    pipes.read(dict(poller.poll(1000)), now=0.0)
    assert poller.poll(0) == []  # or the loop would spin until the reap


def test_a_read_error_is_logged_and_drops_only_that_pipe(pipes: WorkerOutput) -> None:
    poller = zmq.Poller()
    pipes.attach(poller)
    bad = pipes.open("m-1", "m", now=0.0)
    good = pipes.open("m-2", "m", now=0.0)
    try:
        broken, working = list(pipes._by_fd)
        os.close(broken)  # reads now fail with EBADF
        os.write(good, b"still here\n")
        with structlog.testing.capture_logs() as logged:
            pipes.read({broken: zmq.POLLIN, working: zmq.POLLIN}, now=0.0)
            pipes.finish_all(now=0.0)
    finally:
        os.close(bad)
        os.close(good)
    assert [e["event"] for e in logged] == ["worker_output_failed", "worker_output"]
    assert logged[0]["worker"] == "m-1" and logged[1]["line"] == "still here"


def test_the_pipe_buffer_is_enlarged_where_the_kernel_allows() -> None:
    import fcntl  # the service runs on Linux (systemd), where Python has F_GETPIPE_SZ

    out = WorkerOutput()
    write = out.open(W, "m", now=0.0)
    try:
        assert fcntl.fcntl(write, fcntl.F_GETPIPE_SZ) == output.PIPE_SIZE
    finally:
        os.close(write)
        out.finish_all(0.0)


# --- live ----------------------------------------------------------------------------------

def json_lines(sup: Supervisor) -> list[dict[str, Any]]:
    """Every complete line of the supervisor's output, each parsed as a JSON object (fails
    the test on the first line that is not one)."""
    text = sup.log()
    events = []
    for line in text[:text.rfind("\n") + 1].splitlines():  # a line being written may be cut
        value = json.loads(line)
        assert isinstance(value, dict), line[:200]
        events.append(value)
    return events


def wait_log(sup: Supervisor, predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(json_lines(sup)):
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{sup.log()[-4000:]}")


def test_junk_floods_and_crashes_of_workers_reach_the_log_as_json_events(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"noisy": {
        "handler": "tests.output_handlers:noisy", "workers": 1,
        "policy": {"max_attempts": 1}}}},
        # The worker's own stdout buffering, not the test harness's, is what is tested.
        env={"PYTHONUNBUFFERED": ""})
    first = sup.workers("noisy")[0]["id"]

    def output_of(events: list[dict[str, Any]], worker: str) -> list[dict[str, Any]]:
        return [e for e in events if e["event"] == "worker_output" and e["worker"] == worker]

    wait_log(sup, lambda ev: any(e["line"] == "noisy: init done" for e in output_of(ev, first)),
             "the handler's load-time output")
    events = json_lines(sup)
    lines = {e["line"]: e for e in output_of(events, first)}
    for text in output_handlers.INIT_TEXT[:5]:
        assert text in lines, text
        assert lines[text]["model"] == "noisy"
    long = next(e for e in output_of(events, first) if e["line"].startswith("noisy: long x"))
    assert long["truncated"] is True
    assert long["line_bytes"] == len(output_handlers.LONG_LINE)
    assert len(long["line"]) <= TEXT_LIMIT + 1
    own = [e for e in events if e["event"] == "noisy_loaded"]
    assert own and own[0]["worker"] == first and own[0]["model"] == "noisy"  # passed through

    with sup.client() as client:
        x = np.full((1, 4), output_handlers.FLOOD, np.float32)
        assert client.infer("noisy", {"x": x})["x"][0, 0] == output_handlers.FLOOD
        with pytest.raises(JobError):
            client.infer("noisy", {"x": np.full((1, 4), output_handlers.CRASH, np.float32)})
    wait_log(sup, lambda ev: any(e["event"] == "worker_died" and e.get("worker") == first
                                 for e in ev), "the crashed worker's exit")
    sup.stop()
    events = json_lines(sup)  # every line of the output, to the last, is a JSON object
    died = next(i for i, e in enumerate(events)
                if e["event"] == "worker_died" and e.get("worker") == first)
    before = output_of(events[:died], first)
    crash = output_handlers.crash_report().splitlines()
    logged = [e["line"] for e in before]
    assert logged[-len(crash):] == crash  # the traceback and the fatal line, before the exit
    assert before[-1]["level"] == "error"
    assert output_of(events[died:], first) == []
    # Rate-limited, and every line of the worker accounted for: logged or counted.
    assert len(output_of(events, first)) < BURST + TAIL_LINES + 200
    dropped = sum(e["dropped"] for e in events
                  if e["event"] == "worker_output_suppressed" and e["worker"] == first)
    assert dropped > output_handlers.FLOOD_LINES / 2
    written = len(output_handlers.INIT_TEXT) + output_handlers.FLOOD_LINES + len(crash)
    assert len(output_of(events, first)) + dropped == written
