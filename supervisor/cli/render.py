"""What the CLI prints for people: the `status` table and its notes, `explain` in words."""

from __future__ import annotations

from typing import Any

from supervisor.config.units import format_duration, format_size
from supervisor.core.diagnosis import SUSPECT_FRACTION, Split
from supervisor.core.reasons import ExitCause, Hold


def render_status(report: dict[str, Any]) -> str:
    rows = [("MODEL", "WORKER", "PID", "STATE", "MEMORY", "GROWTH/1K", "GROWTH/H", "TO LIMIT",
             "VRAM", "JOBS", "AGE", "SLOT", "NOTE")]
    notes = []
    for name, model in sorted(report["models"].items()):
        for w in model["workers"]:
            growth_1k = _signed(w.get("growth_per_1k_jobs"))
            growth_h = _signed(w.get("growth_per_hour"))
            rows.append((name, w["id"], str(w["pid"]), w["state"], format_size(w.get("memory")),
                         growth_1k, growth_h, format_duration(w.get("seconds_to_limit")),
                         format_size(w.get("vram")), str(w["jobs"]), format_duration(w["age"]),
                         str(w.get("slot", "-")), _worker_note(w, model.get("limits") or {})))
        notes.append(_model_note(name, model, bool(report.get("stopping"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    head = ["STOPPING: draining (queued and running jobs are answered, new ones get "
            "shutting_down; not ready)", ""] if report.get("stopping") else []
    budget = _budget_line(report.get("memory_budget"))
    return "\n".join([*head, *lines, "", *notes, *_supervisor_notes(report.get("supervisor")),
                      *_http_lines(report.get("http")), *([budget] if budget else [])])


def render_top(report: dict[str, Any], columns: int, rows: int,
               model: str | None = None) -> list[str]:
    """`top`'s frame, fitted to a terminal of ``columns`` x ``rows``: a summary first, then
    what needs attention, then a line per model (those in trouble first) as far as there is
    room, and how to see the rest; ``model``: that model's workers in full instead. With 50
    models it printed `status` whole, 104 lines of up to 250 characters, every second."""
    if model is not None:
        if model not in report["models"]:
            lines = [f"no model named {model!r} (served: {', '.join(sorted(report['models']))})"]
        else:
            lines = render_status({**report, "models": {model: report["models"][model]}}
                                  ).splitlines()
        return _fit(lines, columns, rows, "… more: `tfsupervisor status --model "
                                          f"{model}` shows it all")
    models = report["models"]
    workers = [w for m in models.values() for w in m["workers"]]
    starting = [n for n, m in models.items() if not m["available"] and not m["last_error"]]
    down = [n for n, m in models.items() if not m["available"] and m["last_error"]]
    head = [f"{len(models)} models: {len(models) - len(starting) - len(down)} available, "
            f"{len(starting)} starting, {len(down)} UNAVAILABLE; workers "
            f"{sum(w['state'] == 'ready' for w in workers)}/"
            f"{sum(m['configured_workers'] for m in models.values())} ready; queued "
            f"{sum(m['queued'] for m in models.values())}, in flight "
            f"{sum(m['in_flight'] for m in models.values())}"]
    if report.get("stopping"):
        head.append("STOPPING: draining (new jobs get shutting_down)")
    budget = _budget_line(report.get("memory_budget"))
    head += [*_supervisor_notes(report.get("supervisor")), *_http_lines(report.get("http")),
             *([budget] if budget else [])]
    table = [("MODEL", "READY", "QUEUED", "IN FLIGHT", "MEMORY", "GROWTH/H", "RECYCLES",
              "STATE")]
    for name, m in sorted(models.items(), key=lambda item: (not _trouble(item[1]), item[0])):
        memories = [w["memory"] for w in m["workers"] if w.get("memory") is not None]
        growths = [w["growth_per_hour"] for w in m["workers"]
                   if w.get("growth_per_hour") is not None]
        table.append((name, f"{sum(w['state'] == 'ready' for w in m['workers'])}/"
                      f"{m['configured_workers']}", str(m["queued"]), str(m["in_flight"]),
                      format_size(max(memories)) if memories else "-",
                      _signed(max(growths)) if growths else "-",
                      str(sum(m["recycles"].values())),
                      _model_note(name, m, bool(report.get("stopping")))
                      .removeprefix(f"{name}: ").split("; queued")[0]))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = [*head, "", *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                          .rstrip() for r in table)]
    return _fit(lines, columns, rows, "… {hidden} more models: `tfsupervisor status` shows "
                                      "all, `top --model NAME` one in full")


def _trouble(model: dict[str, Any]) -> bool:
    return not model["available"] or bool(model.get("failing_to_start")) or \
        bool(model.get("recycles_held_back")) or bool(model.get("policy_too_tight")) or \
        any(w.get("over_limits") for w in model["workers"])


def _fit(lines: list[str], columns: int, rows: int, more: str) -> list[str]:
    """At most ``rows`` lines of fewer than ``columns`` characters (a full line wraps on
    some terminals); the last says what was left out."""
    width = max(columns - 1, 10)
    cut = [line if len(line) <= width else line[:width - 1] + "…" for line in lines]
    if len(cut) <= rows:
        return cut
    keep = max(rows - 1, 0)
    return [*cut[:keep], more.format(hidden=len(cut) - keep)[:width]]


def _http_lines(http: dict[str, Any] | None) -> list[str]:
    """One line for the HTTP fronts: how many run, and what the restarts were."""
    if not http:
        return []
    fronts = http["fronts"]
    running = sum(1 for f in fronts if f["state"] == "running")
    restarts = sum(f["restarts"] for f in fronts)
    where = " ".join(f"{kind} {http[key]}" for kind, key in (("http", "listen"),
                                                               ("grpc", "grpc"))
                     if http.get(key))
    line = f"{where}: {running} of {len(fronts)} front(s) running"
    if restarts:
        last = [f"front {f['slot']}: {f['last_exit']}" for f in fronts if f["last_exit"]]
        line += f"; {restarts} restart(s) ({'; '.join(last)})"
    return [line]
def _budget_line(budget: dict[str, Any] | None) -> str | None:
    """The container's memory, when the daemon runs under a cgroup limit."""
    if not budget or (budget.get("limit") is None and budget.get("high") is None):
        return None
    limit = budget.get("limit")
    high = f", high {format_size(budget['high'])}" if budget.get("high") is not None else ""
    line = budget.get("pressure_line")
    floor = f"kill buffer {format_size(budget['kill_buffer'])}"
    if line is not None:  # the line the rate draws (core/budget.py, Pressure)
        floor = (f"pressure line {format_size(line)}: {floor} + growth "
                 f"{format_size(budget.get('growth_rate') or 0)}/s x recycle lead "
                 f"{budget.get('recycle_lead_seconds') or 0:.1f}s")
    return (f"memory budget (cgroup v{budget['version']} {budget['cgroup']}): limit "
            f"{format_size(limit)}{high}, working set {format_size(budget['working_set'])}, "
            f"headroom {format_size(budget.get('headroom'))} ({floor}); kernel OOM kills "
            f"since start: {budget['oom_kills']}")


def _supervisor_notes(own: dict[str, Any] | None) -> list[str]:
    """The daemon's own resources, when one needs attention."""
    if not own:
        return []
    notes = []
    if own.get("log_lines_dropped"):
        notes.append(f"supervisor: {own['log_lines_dropped']} LOG LINE(S) DROPPED, its log "
                     f"output fails ({own.get('log_error')}); it serves on")
    if own.get("code_bounded"):
        notes.append("supervisor: code fingerprints cover only part of "
                     f"{', '.join(own['code_bounded'])} (too many files, too deep or too "
                     "large): a change past the bound is not seen")
    fds = own.get("descriptors") or {}
    if fds.get("paused"):
        notes.append(f"supervisor: NEW CONNECTIONS PAUSED on {', '.join(fds['paused'])}: "
                     f"{fds.get('open')} of {fds.get('limit')} descriptors open, "
                     f"{fds.get('reserve')} kept in reserve (raise LimitNOFILE)")
    return notes


def _worker_note(w: dict[str, Any], limits: dict[str, int]) -> str:
    """What an operator should know about one worker, in words: a limit it is over, why it
    is leaving, a recycle that waits, or that its trend is not judged yet."""
    parts = []
    for limit in w.get("over_limits") or []:
        figure = w.get("vram") if limit == "max_vram" else w.get("memory")
        parts.append(f"OVER {limit} ({format_size(figure)} >= {format_size(limits.get(limit))})")
    held = w.get("recycle_held_back")
    if held and held["why"] == Hold.BACKOFF:
        parts.append(f"serving on: its replacement ({held['reason']}) fails to start, "
                     "retried with back-off")
    elif held and held["why"] == Hold.NO_ROOM:
        parts.append(f"serving on: the model's last ready worker, its replacement "
                     f"({held['reason']}) waits for room in the container's memory")
    elif held:
        parts.append(f"recycle ({held['reason']}) held back: max_concurrent_recycles "
                     "already under way")
    elif w.get("recycle_reason"):
        parts.append(f"leaving: {w['recycle_reason']}")
    if w.get("suspected"):
        parts.append(f"growing: {w['suspected']}")
    if w.get("code_current") is False:
        parts.append("runs code older than on disk (reload to roll)")
    if not parts and not w.get("warmed_up") and w.get("state") == "ready":
        parts.append("policy warm-up")  # a starting worker is not judged by policy at all
    return "; ".join(parts)


def _model_note(name: str, model: dict[str, Any], stopping: bool = False) -> str:
    recycles = ", ".join(f"{k}={v}" for k, v in sorted(model["recycles"].items())) or "none"
    state = "available" if model["available"] else \
        f"UNAVAILABLE: {model['last_error']}" if model.get("last_error") else \
        "STARTING: no worker ready yet (its jobs wait in the queue)"
    if stopping:  # its workers finish what they have; it takes nothing new
        state = "DRAINING (the supervisor is stopping)"
    if model["available"] and model.get("failing_to_start"):  # old workers serve on
        state += f"; NEW WORKERS FAIL TO START: {model['last_error']} (retried with back-off)"
    if model.get("removed"):
        state = "REMOVING (dropped by a reload: finishing its queue, taking no new jobs)"
    last = model.get("last_recycle")
    last_text = f"; last: {last['reason']} ({last['worker']}, " \
                f"{format_duration(last['seconds_ago'])} ago)" if last else ""
    if last and last.get("remedy"):
        last_text += f"; cause {last['cause']}: {last['remedy']}"
    paused_text = "; POLICY TOO TIGHT: young workers keep being recycled for memory " \
                  "(docs/policy.md)" if model.get("policy_too_tight") else ""
    held = model.get("recycles_held_back") or 0
    held_text = f"; {held} recycle(s) HELD BACK (see NOTE)" if held else ""
    over = sum(1 for w in model["workers"] if w.get("over_limits"))
    over_text = f"; {over} worker(s) OVER A LIMIT, on their way out" if over else ""
    exits = model.get("exits") or {}
    exits_text = "; exits: " + ", ".join(f"{k}={v}" for k, v in sorted(exits.items())) \
        if exits else ""
    unexpected = model.get("last_unexpected_exit")
    unexpected_text = f"; LAST UNEXPECTED EXIT: {unexpected['cause']} ({unexpected['worker']} " \
                      f"slot {unexpected['slot']}, {unexpected['exit']}, " \
                      f"{format_duration(unexpected['seconds_ago'])} ago)" if unexpected else ""
    if unexpected and unexpected["cause"] == ExitCause.KILLED_EXTERNALLY:
        unexpected_text += ": a SIGKILL the supervisor did not send, and no kernel OOM kill " \
                           "counted in its memory cgroup"
    elif unexpected and unexpected["cause"] == ExitCause.OOM_KILLED:
        unexpected_text += ": the kernel's OOM killer, at the container's memory limit " \
                           "(see the memory budget line; docs/deployment.md)"
    unknown_text = "; CODE ON DISK UNKNOWN (its handler module is not found where the worker " \
                   "imports from, or its files did not answer)" if model.get("code_unknown") else ""
    batches = model.get("batches") or {}
    batch_text = f"; batches of {batches['mean_rows']} rows on average (max " \
                 f"{batches['max_batch_size']}, {batches.get('padding_share') or 0:.0%} of " \
                 "rows computed were padding)" if batches.get("mean_rows") else ""
    wait = batches.get("wait")
    if wait and batches.get("max_batch_size", 1) > 1:
        batch_text += f"; batch wait {wait['ms']:g} ms ({wait['mode']}: {wait['why']})"
    return (f"{name}: {state}; queued {model['queued']}, in flight {model['in_flight']}"
            f"{batch_text}; {model['memory_metric']} limit "
            f"{format_size(model.get('max_memory'))}; recycles: {recycles}{last_text}"
            f"{held_text}{over_text}{paused_text}{exits_text}{unexpected_text}{unknown_text}")


def _signed(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value >= 0 else "") + format_size(value)


def render_explain(report: dict[str, Any]) -> str:
    """Per worker, in plain words: the suspected cause and its remedy, the probes' trends,
    what accounts for the growth, what was traced most, the input shapes that grew it most,
    the Python types growing."""
    lines = [f"model {report['model']} ({report['memory_metric']}), "
             f"{len(report['workers'])} worker process(es), replacements included"]
    last = report.get("last_recycle")
    if last:
        lines.append(f"last recycle: {last['reason']} of {last['worker']}"
                     + (f", cause {last['cause']}: {last['summary']}" if last.get("summary")
                        else ""))
    died = report.get("last_unexpected_exit")
    if died and died.get("cause") == ExitCause.OOM_KILLED:
        budget = report.get("memory_budget") or {}
        lines.append(f"last unexpected exit: {died['worker']} killed by the kernel's OOM "
                     f"killer at the container's limit ({format_size(budget.get('limit'))}, "
                     f"{budget.get('oom_kills', '?')} OOM kill(s) since start): the workers "
                     "outgrew the container between two polls; set or lower kill_memory, "
                     "lower poll_interval, or raise min_available_memory or the limit")
    for w in report["workers"]:
        lines += ["", f"{w['id']} (slot {w['slot']}, {w['state']}, {w['jobs']:,} jobs, memory "
                  f"{format_size(w['memory'])}, baseline {format_size(w['baseline'])})"]
        lines += [f"  {line}" for line in _explain_worker(w, report["memory_metric"])]
    return "\n".join(lines)


def _not_suspected(w: dict[str, Any]) -> str:
    """No suspected cause: judged, with the policy's own figures beside its limits; or not
    judged yet (warm-up, or a trend window not yet full), with what it grew so far. Never a
    word about noise above the probes' figures: they are fitted on fewer samples than the
    policy needs, and a worker growing 1.3 GiB per 1k jobs in an unfilled window was said
    to be "not growing beyond noise"."""
    so_far = w.get("so_far")
    grew = f"; so far {_signed(so_far['memory'])} over {so_far['jobs']:,} jobs" \
        if so_far else ""
    if w.get("warmed_up") is False:
        return ("not judged yet: the policy's warm-up (warmup_jobs, warmup_seconds) has not "
                f"passed, and growth while warming up is not a trend unless the worker's "
                f"own tracing explains it{grew}")
    judged = w.get("judged") or {}
    if not judged.get("window"):
        needed = judged.get("window_needed")
        return ("not judged yet: the policy's trend window is not full" +
                (f" (it needs {needed} samples after warm-up)" if needed else "") + grew)
    slopes = [f"{_signed(judged[key])} {label}" for key, label in
              (("growth_per_1k_jobs", "per 1k jobs"), ("growth_per_hour", "per hour"))
              if judged.get(key) is not None]
    return (f"no suspected cause: judged over {judged['window']} samples, its memory grows "
            f"{' and '.join(slopes) or 'by no measure'}, {_against_limits(judged)}" + grew)


def _against_limits(judged: dict[str, Any]) -> str:
    """How the judged slopes stand against the growth limits that are set, said only as far
    as it is true: with both limits off there is nothing to be under, and a slope above a
    quarter of its limit (a worker recycled for max_age, say, whose growth no diagnosis
    was made for) is not "under a quarter"."""
    pairs = [(judged.get(slope), key, judged[key]) for slope, key in
             (("growth_per_1k_jobs", "max_growth_per_1k_jobs"),
              ("growth_per_hour", "max_growth_per_hour")) if judged.get(key) is not None]
    if not pairs:
        return ("and no growth limit is set (max_growth_per_1k_jobs and max_growth_per_hour "
                "are off): growth is not judged")
    limits = ", ".join(f"{key} {format_size(limit)}" for _, key, limit in pairs)
    ratios = [value / limit for value, _, limit in pairs if value is not None and limit > 0]
    if all(r <= SUSPECT_FRACTION for r in ratios):
        return f"under a quarter of its limits ({limits})"
    return (f"{max(ratios):.0%} of its limits at the most ({limits}), not confidently over "
            "them")


def _explain_worker(w: dict[str, Any], metric: str = "memory") -> list[str]:
    found = w.get("diagnosis")
    out = [f"suspected cause: {found['cause']} - {found['summary']}",
           f"remedy: {found['remedy']}"] if found else [_not_suspected(w)]
    t = w["trends"]
    names = [("memory", "memory", True), ("graphs", "traced graphs", False),
             ("shapes", "new input shapes", False), ("py_blocks", "Python allocations", False),
             ("native_heap", "native heap", True), ("tf_allocator", "TF allocator", True),
             ("vram", "VRAM", True)]
    figures = [f"{label} {(_signed if size else _count)(t[f'{k}_per_1k_jobs'])}"
               for k, label, size in names if f"{k}_per_1k_jobs" in t]
    where = " since ready, in warm-up" if t.get("window_in_warmup") else \
        " since ready (too few after warm-up to fit)" if t.get("window_since_ready") else ""
    if figures and not t["window_jobs"]:  # idle: a slope per 1k jobs means nothing
        out.append(f"trends: no jobs over the last {t['window_samples']} samples{where}")
    else:
        out.append(f"per 1k jobs over the last {t['window_samples']} samples{where} "
                   f"({t['window_jobs']:,} jobs): {', '.join(figures)}" if figures else
                   f"trends: not enough samples yet ({t['window_samples']}{where})")
    split = Split.from_fields(w.get("growth_split"))
    if split is not None and t["window_jobs"]:
        out.append(split.text(metric))
    probes = w.get("probes") or {}
    if probes.get("traced"):
        out.append("traced most: " + ", ".join(f"{n} x{c:,}" for n, c in probes["traced"]))
    if probes.get("top_shapes"):
        out.append("input shapes that grew it most: " + ", ".join(
            f"{s} {_signed(g)} ({_signed(f)} on first sight, {b:,} batches)"
            for s, b, f, g in probes["top_shapes"][:5]))
    if probes.get("census"):
        out.append("Python types growing: " + ", ".join(f"{n} {c:+,}" for n, c in
                                                        probes["census"]))
    if probes.get("containers"):
        jobs = probes.get("census_jobs")
        out.append("containers growing" + (f" (over {jobs:,} jobs)" if jobs else "") + ": "
                   + ", ".join(f"{n} {c:+,} items" for n, c in probes["containers"]))
    cost = _probe_cost(w)
    if cost:
        out.append(cost)
    return out


# Below this many jobs a cost per job is mostly the probes' one-off readings at start (a
# census of every object: ~100 ms in a TF worker) divided by a handful of jobs.
COST_JOBS = 1000


def _probe_cost(w: dict[str, Any]) -> str | None:
    per_job = w.get("probe_cost_per_job")
    if per_job is None:
        return None
    probes = w.get("probes") or {}
    jobs = int(probes.get("jobs") or w.get("jobs") or 0)
    if jobs >= COST_JOBS:
        return f"probes cost {per_job * 1e6:.1f} us per job over {jobs:,} jobs"
    total = probes.get("cost_seconds", per_job * jobs)
    return (f"probes took {float(total) * 1e3:.1f} ms over its first {jobs:,} job(s), "
            f"mostly one-off readings at start; a cost per job means something after "
            f"{COST_JOBS:,} jobs")


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:+,.1f}"
