"""The daemon's signal inbox: each recorded signal is taken exactly once."""

from __future__ import annotations

import signal

from supervisor.daemon.signals import SignalInbox


def test_a_signal_recorded_while_the_taken_ones_are_handled_is_taken_once() -> None:
    inbox = SignalInbox()
    handled: list[int] = []
    taken = inbox.take(woken=False)  # nothing pending
    inbox._record(signal.SIGHUP, None)  # arrives while the caller handles what it took
    handled.extend(taken)
    handled.extend(inbox.take(woken=False))
    handled.extend(inbox.take(woken=False))
    assert handled == [signal.SIGHUP]
