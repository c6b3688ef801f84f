"""The adaptive batch wait: how long a partial batch waits for more jobs when the model's
``batch_timeout_ms`` is not set, decided from what the supervisor measures of that model.

A wait only pays when more jobs will come during it *and* each job that joins saves the
workers a call's fixed cost:

- **Few requests** (on average fewer jobs outstanding, queued or in a worker, than there are
  ready workers, when a job arrives): every job finds an idle worker, nothing would join a
  waiting batch, so there is no wait (one client waiting on each answer sees no added
  latency).
- **Requests queue** (more outstanding than workers): a batch is held to gather the rows
  that make a call's fixed cost small beside its per-row cost (``a / n <= SHARE * b``), no
  more than the outstanding jobs spread over the workers, at most ``max_batch_size``; the
  wait is the time the measured arrival rate takes to bring them.
- **Bounded**: never longer than ``CALLS`` calls of that batch take (a worker would have
  served a whole batch meanwhile), nor ``MAX_WAIT`` in all.
- **Cores contended** (tasks wait for a CPU, ``core/cpu.py``): a worker's call is then not
  the bottleneck, the cores are, and every call's fixed costs (the daemon's, the worker's,
  the wake-ups) take them from the clients and the other workers; spreading jobs over
  workers buys no parallelism when no core is free to run them. The batch is held for the
  most jobs outstanding at once lately (not their mean, not spread over the workers) less
  those in a busy worker now (they cannot join), at most ``max_batch_size``, for as long
  as the arrival rate takes to bring them, bounded as above. Demo MLP, 32 clients
  sharing 2 cores with the server: batches of ~31 rows instead of ~6 (docs/performance.md).

Measured per model: arrivals (rows per second, smoothed over ``WINDOW`` windows), jobs
outstanding at each arrival (smoothed), and each batch's time from dispatch to its answer
(the call as the supervisor sees it: transport included), fitted as ``a + b * rows`` by
least squares with old batches forgotten gradually. Pure: time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW = 0.25  # seconds over which arrivals are counted before they update the rate
RATE_WEIGHT = 0.5  # weight of the newest window in the smoothed arrival rate
OUTSTANDING_WEIGHT = 0.05  # weight of the newest arrival in the smoothed outstanding count
FORGET = 0.98  # each batch's weight in the cost fit shrinks by this per later batch
SHARE = 0.25  # a call's fixed cost, per row, is small once below this share of a row's cost
CALLS = 2.0  # a wait never exceeds this many calls of the batch it waits for
MAX_WAIT = 0.020  # seconds: the wait's absolute bound
MIN_ROW_COST = 1e-7  # seconds: a per-row cost below this counts as none


@dataclass
class Decision:
    """A wait and why (shown by ``status``)."""

    seconds: float
    reason: str


@dataclass
class Costs:
    """Seconds per call ``a`` and per row ``b`` of a model, or None until measured."""

    per_call: float
    per_row: float

    def call(self, rows: int) -> float:
        return self.per_call + self.per_row * rows


class BatchWait:
    """One model's measurements and the wait they give."""

    def __init__(self) -> None:
        self.rate = 0.0  # rows per second arriving
        self.outstanding = 0.0  # jobs queued or in a worker when a job arrives, smoothed
        self.peak = 0  # the most jobs outstanding at once, itself included, in the last window
        self._window_peak = 0
        self._window_start: float | None = None
        self._window_rows = 0
        # Weighted sums of the cost fit: weight, rows, seconds, rows², rows x seconds.
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    # --- measurements ------------------------------------------------------------------------

    def arrived(self, rows: int, outstanding: int, now: float) -> None:
        """A job of ``rows`` rows was admitted with ``outstanding`` jobs already in."""
        self._roll(now)
        self._window_rows += rows
        self._window_peak = max(self._window_peak, outstanding + 1)
        self.outstanding += OUTSTANDING_WEIGHT * (outstanding - self.outstanding)

    def called(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` rows was answered ``seconds`` after it was dispatched."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        for name in ("_w", "_n", "_t", "_nn", "_nt"):
            setattr(self, name, getattr(self, name) * FORGET)
        self._w += 1.0
        self._n += rows
        self._t += seconds
        self._nn += rows * rows
        self._nt += rows * seconds

    def _roll(self, now: float) -> None:
        """Fold the elapsed windows into the rate (an idle spell decays it)."""
        if self._window_start is None:
            self._window_start = now
            return
        elapsed = now - self._window_start
        if elapsed < WINDOW:
            return
        # The rows counted so far make one window; whole windows after it had none.
        span = min(elapsed, 2 * WINDOW)
        self.rate += RATE_WEIGHT * (self._window_rows / span - self.rate)
        empty = min((elapsed - span) / WINDOW, 64.0)
        self.rate *= (1.0 - RATE_WEIGHT) ** empty
        self.peak = self._window_peak if empty < 1 else 0  # an idle spell: no peak
        self._window_start, self._window_rows, self._window_peak = now, 0, 0

    def costs(self) -> Costs | None:
        """The fitted cost per call and per row (None before any batch was answered). Batches
        all of one size cannot separate the two: their whole time counts per call."""
        if self._w <= 0:
            return None
        mean_n, mean_t = self._n / self._w, self._t / self._w
        spread = self._nn / self._w - mean_n * mean_n
        if spread < 0.25:
            return Costs(mean_t, 0.0)
        per_row = max(0.0, (self._nt / self._w - mean_n * mean_t) / spread)
        per_call = max(0.0, mean_t - per_row * mean_n)
        return Costs(per_call, per_row)

    # --- the decision ------------------------------------------------------------------------

    def decide(self, workers: int, max_batch_size: int, now: float,
               contended: bool = False, in_workers: int = 0) -> Decision:
        """The wait for a partial batch now, with ``workers`` ready workers; ``contended``:
        tasks are waiting for a CPU (``core/cpu.py``); ``in_workers``: the model's jobs in
        its busy workers now (their clients cannot send more until they are answered)."""
        self._roll(now)
        costs = self.costs()
        if max_batch_size <= 1:
            return Decision(0.0, "batching is off (max_batch_size 1)")
        if costs is None or self.rate <= 0:
            return Decision(0.0, "no wait: nothing measured yet")
        workers = max(1, workers)
        if self.outstanding < workers:
            return Decision(0.0, f"no wait: {self.outstanding:.1f} jobs outstanding on "
                            f"average for {workers} workers, so each finds one idle")
        if costs.per_row < MIN_ROW_COST:
            worth = max_batch_size
        else:
            worth = math.ceil(costs.per_call / (SHARE * costs.per_row))
        most = min(worth, max_batch_size)
        if contended:
            # The most outstanding at once lately, less those in a worker now: they cannot
            # join, their clients come back only once they are answered.
            rows = min(most, self.peak - in_workers)
            why = (f", the cores being contended: up to {self.peak} jobs outstanding at once "
                   f"lately, {in_workers} in a worker now")
            if most > 1 and rows <= 1:
                return Decision(0.0, f"no wait: up to {self.peak} jobs outstanding at once "
                                f"lately, as many or more in a worker now ({in_workers})")
        else:
            rows = min(most, math.ceil(self.outstanding / workers))
            why = f": {self.outstanding:.1f} jobs outstanding for {workers} workers"
        if rows <= 1:
            return Decision(0.0, f"no wait: a call's fixed cost ({costs.per_call * 1e3:.2f} "
                            f"ms) is small beside a row's ({costs.per_row * 1e3:.2f} ms)")
        # Bounded by CALLS calls under contention too: jobs that pile up during a wait raise
        # the peak, and an open-loop load at 3,000 jobs/s waited out the 20 ms bound without.
        wait = min((rows - 1) / self.rate, CALLS * costs.call(rows), MAX_WAIT)
        return Decision(wait, f"waiting for ~{rows} rows{why}, {self.rate:.0f} rows/s "
                        f"arriving, {_costs(costs)}")


def _costs(costs: Costs) -> str:
    return f"a call costs {costs.per_call * 1e3:.2f} ms + {costs.per_row * 1e3:.3f} ms per row"
