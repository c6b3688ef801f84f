"""`tfsupervisor tune`: a YAML snippet of policy and padding settings for each model, each
value with its evidence, from the running daemon's record (or a saved one); ``--write``
puts it into the config file, keeping its comments and layout, once `check` accepts it.

The rules are ``supervisor/core/tuning.py``'s; this is the I/O around them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

from supervisor.cli.argtypes import timeout_seconds
from supervisor.cli.outcome import is_unknown_model, no_such_model
from supervisor.cli.tune_write import TuneError, current, prepared, same, shown, write
from supervisor.config.keys import Config, ModelConfig
from supervisor.config.loading import load_config
from supervisor.config.settings import ConfigErrors
from supervisor.config.units import format_duration, parse_duration
from supervisor.core.tuning import (
    Finding,
    HistoryError,
    ModelTuning,
    Options,
    Recorded,
    parse_history,
    tune_model,
)

# A saved history larger than this is not one `tune --save` wrote (a few MiB at most).
MAX_HISTORY_BYTES = 64 * 1024**2
WRAP = 92


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="only this model (default: every model)")
    parser.add_argument("--since", type=_duration, metavar="DURATION",
                        help="only workers and samples of this last stretch (e.g. 24h); "
                        "batch sizes and lengths count since the daemon started")
    parser.add_argument("--history", metavar="FILE",
                        help="tune from a history saved with --save, not the running daemon")
    parser.add_argument("--save", metavar="FILE",
                        help="also save the daemon's record to FILE (JSON), to tune offline; "
                        "a new file unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --save replace an existing regular file (never the config)")
    parser.add_argument("--write", action="store_true",
                        help="write the suggested values into the config file (comments and "
                        "layout kept), once `check` accepts the result; prints the diff")
    parser.add_argument("--max-padding", type=_fraction, default=0.10, metavar="PERCENT",
                        help="padded rows or positions allowed for batch and padding sizes "
                        "(default 10%%)")
    parser.add_argument("--headroom", type=_fraction, default=0.25, metavar="PERCENT",
                        help="max_memory above the highest healthy figure (default 25%%)")
    parser.add_argument("--timeout", type=timeout_seconds, default=30.0,
                        help="seconds to wait for each answer (default 30)")


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("expected a duration > 0")
    return seconds


def _fraction(text: str) -> float:
    """10% or 0.1."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 10%, got {text!r}") \
            from None
    if not math.isfinite(value) or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a percentage above 0% and below 100% "
                                         f"(both excluded), got {text!r}")
    return value


def run(args: argparse.Namespace, endpoint: str | None, curve: dict[str, Any]) -> int:
    try:
        return _run(args, endpoint, curve)
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, endpoint: str | None, curve: dict[str, Any]) -> int:
    try:
        config = load_config(args.config)
    except ConfigErrors as errors:
        raise TuneError(f"{args.config}: {len(errors.errors)} error(s):\n  " +
                        "\n  ".join(str(e) for e in errors.errors)) from None
    if args.model is not None and args.model not in config.models:
        raise TuneError(no_such_model(args.model, config.models, f" in {args.config}"))
    if args.save:
        check_save(Path(args.save), Path(args.config), args.overwrite)
    if args.history:
        raw = read_history(Path(args.history))
        source = f"history {args.history}"
    else:
        assert endpoint is not None
        raw = fetch(endpoint, [args.model] if args.model else sorted(config.models),
                    args.timeout, curve)
        source = f"the daemon at {endpoint}"
    try:
        recorded = parse_history(raw)
    except HistoryError as exc:
        raise TuneError(f"{args.history or endpoint}: {exc}") from None
    if args.save:
        save_history(Path(args.save), raw, args.overwrite)
        print(f"# saved the daemon's record to {args.save} "
              f"(`tfsupervisor tune --history {args.save}` tunes from it)")
    names = [args.model] if args.model else sorted(config.models)
    missing = [n for n in names if n not in recorded.models]
    if args.model and missing:
        raise TuneError(f"{source} has no record of model {args.model!r} (recorded: "
                        f"{', '.join(sorted(recorded.models)) or 'none'})")
    options = Options(max_padding=args.max_padding, headroom=args.headroom,
                      since=args.since)
    tunings = [tune_model(n, recorded.models[n], config.models[n], recorded, options)
               for n in names if n in recorded.models]
    print(render(tunings, config, source, recorded, options, missing))
    if args.write:
        return write(Path(args.config), config, tunings)
    return 0


def fetch(endpoint: str, models: list[str], timeout: float,
          curve: dict[str, Any]) -> dict[str, Any]:
    """The daemon's record, asked model by model (each answer stays well within a control
    reply's bounds); a model the daemon does not serve (yet) is left out."""
    from supervisor.client.client import JobError, NoReply, control
    from supervisor.shared.protocol import INTERNAL_HOP

    merged: dict[str, Any] | None = None
    for model in models:
        try:
            result = control(endpoint, "tune", timeout=timeout, model=model,
                             limits=INTERNAL_HOP, **curve)
        except NoReply:
            raise  # no daemon there: the command's UNREACHABLE status, not a tuning error
        except JobError as exc:
            if is_unknown_model(exc.message) and len(models) > 1:
                continue
            raise TuneError(exc.message) from None
        if not isinstance(result, dict) or not isinstance(result.get("models"), dict):
            raise TuneError(f"{endpoint}: the daemon's answer to 'tune' is not a history (an "
                            "older tfsupervisor?)")
        if merged is None:
            merged = result
        else:
            merged["models"].update(result["models"])
    if merged is None:
        raise TuneError(f"{endpoint}: the daemon serves none of {', '.join(models)}")
    return merged


def read_history(path: Path) -> object:
    """A saved history, read whole but bounded; TuneError for anything that is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TuneError(f"cannot read {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TuneError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(MAX_HISTORY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_HISTORY_BYTES:
        raise TuneError(f"{path}: larger than {MAX_HISTORY_BYTES // 1024**2} MiB: not a "
                        "history `tune --save` wrote")

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a number a history holds")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse)
    except UnicodeDecodeError as exc:
        raise TuneError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise TuneError(f"{path}: not a history (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError too: a truncated file says where it ends
        raise TuneError(f"{path}: not a valid history: {str(exc)[:200]}") from None


def check_save(path: Path, config: Path, overwrite: bool) -> None:
    """Refuse a --save path before anything is asked of the daemon: one that is there and
    not a regular file (a device, a pipe, a directory), the config file itself, and an
    existing file unless --overwrite."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TuneError(f"--save {path}: {exc.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise TuneError(f"--save {path}: there is something there that is not a regular file "
                        "(a device, a pipe or a directory); give the path of a file")
    with contextlib.suppress(OSError):
        if os.path.samefile(path, config):
            raise TuneError(f"--save {path} is the config file itself; give another path")
    if not overwrite:
        raise TuneError(f"--save {path}: the file exists; give a new path, or pass "
                        "--overwrite to replace it")


def save_history(path: Path, raw: object, overwrite: bool) -> None:
    try:
        text = json.dumps(raw, separators=(",", ":"), allow_nan=False) + "\n"
    except ValueError as exc:  # a NaN in the daemon's answer: a bug, said plainly
        raise TuneError(f"the daemon's record cannot be saved as JSON: {exc}") from None
    try:
        with prepared(path, text, keep=False, overwrite=overwrite) as (commit, _, _):
            commit()
    except FileExistsError:
        raise TuneError(f"--save {path}: a file appeared there meanwhile; left it alone") \
            from None
    except OSError as exc:
        raise TuneError(f"cannot write {path}: {exc.strerror}") from None


# --- the snippet ---------------------------------------------------------------------------

def render(tunings: list[ModelTuning], config: Config, source: str, recorded: Recorded,
           options: Options, missing: list[str]) -> str:
    since = f", the last {options.since:g}s" if options.since else ""
    lines = [f"# tfsupervisor tune: from {source}{since}",
             f"# padding target <= {options.max_padding:.0%}, max_memory headroom "
             f"{options.headroom:.0%}, trend limits x {options.trend_margin:g} the steepest "
             "healthy slope",
             "models:"]
    for name in missing:
        lines.append(f"  # {name}: no record yet (not served by this daemon)")
    for tuning in tunings:
        model = config.models[tuning.model]
        lines.append(f"  {tuning.model}:")
        lines += _comment(tuning.summary, 4)
        notes = [f for f in tuning.findings if f.path == ("note",)]
        for note in notes:
            lines += _comment(note.evidence, 4)
        short = short_record(tuning, recorded)
        if short:
            lines += _comment(short, 4)
        sections: dict[tuple[str, ...], list[Finding]] = {}
        for finding in tuning.findings:
            if finding.path != ("note",):
                sections.setdefault(finding.path[:-1], []).append(finding)
        for section, findings in sections.items():
            for depth, key in enumerate(section):
                lines.append(" " * (4 + 2 * depth) + f"{key}:")
            indent = 4 + 2 * len(section)
            for f in findings:
                now = current(model, f.path)
                key = f.path[-1]
                if f.value is None:
                    lines += _comment(f"{key}: {f.evidence} (now: {shown(f.path, now)})",
                                      indent)
                    continue
                tail = "" if f.write else " [review: not written by --write]"
                tail = warmup_growth(model, f) + tail
                unchanged = " (unchanged)" if same(f.path, f.value, now) else \
                    f" (now: {shown(f.path, now)})"
                lines += _comment(f.evidence + unchanged + tail, indent)
                value = "[" + ", ".join(str(v) for v in f.value) + "]" \
                    if isinstance(f.value, list) else str(f.value)
                prefix = "" if f.write else "# "
                lines.append(" " * indent + f"{prefix}{key}: {value}")
    return "\n".join(lines)


# A record shorter than this has not seen a day's drift: limits taken from it are tight.
SHORT_RECORD = 3600.0


def short_record(tuning: ModelTuning, recorded: Recorded) -> str | None:
    """A note when policy values come from a short record: a warm-up of 0 jobs and trend
    limits at their floor read as findings, where they say only that little was seen."""
    if not any(f.path[0] == "policy" and f.value is not None for f in tuning.findings):
        return None
    history = recorded.models.get(tuning.model)
    watched = max((w.life[-1].t - w.ready_at for w in history.workers if w.life),
                  default=0.0) if history else 0.0
    if watched >= SHORT_RECORD:
        return None
    return (f"NOTE: a short record: its longest-watched worker served "
            f"{format_duration(max(watched, 0.0))} after ready. The warm-up, max_memory and "
            "trend limits below come from that much traffic: a warm-up of 0 jobs means the "
            "workers were level from their first job, a trend limit at its floor that little "
            "growth was seen. Tune again after a day of traffic (--since 24h)")


def warmup_growth(model: ModelConfig, finding: Finding) -> str:
    """For more padding sizes: how many shapes each worker then warms before it is ready
    (warmup_batch_sizes x every combination of sizes), against today."""
    if finding.path[0] != "padding" or not isinstance(finding.value, list):
        return ""
    sizes = {name: len(dim.sizes) for name, dim in model.padding.items()}
    now = len(model.warmup_batch_sizes) * math.prod(sizes.values())
    sizes[finding.path[1]] = len(finding.value)
    then = len(model.warmup_batch_sizes) * math.prod(sizes.values())
    if then <= now:
        return ""
    return (f"; the warm-up grows from {now} to {then} shapes ({then / now:.1f}x): each "
            "worker takes about that much longer to become ready")


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent + "# "
    return textwrap.wrap(text, WRAP - len(pad), initial_indent=pad, subsequent_indent=pad + "  ",
                         break_on_hyphens=False, break_long_words=False)


# --- --write -------------------------------------------------------------------------------
