"""`tfsupervisor tune`: a YAML snippet of policy and padding settings for each model, each
value with its evidence, from the running daemon's record (or a saved one); ``--write``
puts it into the config file, keeping its comments and layout, once `check` accepts it.

The rules are ``supervisor/core/tuning.py``'s; this is the I/O around them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import math
import os
import stat
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.cli.argtypes import timeout_seconds
from supervisor.config.keys import Config, ModelConfig
from supervisor.config.loading import load_config, parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.config.units import format_size, parse_duration, parse_size
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


class TuneError(Exception):
    """Said to the operator as it is, exit 1."""


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
        raise TuneError(f"no model named {args.model!r} in {args.config} (models: "
                        f"{', '.join(sorted(config.models))})")
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
    from supervisor.client.client import JobError, control
    from supervisor.shared.protocol import INTERNAL_HOP

    merged: dict[str, Any] | None = None
    for model in models:
        try:
            result = control(endpoint, "tune", timeout=timeout, model=model,
                             limits=INTERNAL_HOP, **curve)
        except JobError as exc:
            if exc.message.startswith("no model named") and len(models) > 1:
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
        with _prepared(path, text, keep=False, overwrite=overwrite) as (commit, _, _):
            commit()
    except FileExistsError:
        raise TuneError(f"--save {path}: a file appeared there meanwhile; left it alone") \
            from None
    except OSError as exc:
        raise TuneError(f"cannot write {path}: {exc.strerror}") from None


# --- the snippet ---------------------------------------------------------------------------

def current(config: ModelConfig, path: tuple[str, ...]) -> Any:
    """The value in force for a finding's path (None where it is not set)."""
    if path[0] == "policy":
        return getattr(config.policy, path[1], None)
    if path[0] == "batching":
        return getattr(config.batching, path[1], None)
    if path[0] == "padding" and path[1] in config.padding:
        return config.padding[path[1]].sizes
    return None


def shown(path: tuple[str, ...], value: Any) -> str:
    if value is None:
        return "off" if path[0] == "policy" else "not set"
    if path[-1] in ("warmup_seconds",) and isinstance(value, float):
        return f"{value:g}s"
    if isinstance(value, int) and path[-1] in ("max_memory", "kill_memory",
                                               "max_growth_per_1k_jobs", "max_growth_per_hour"):
        return format_size(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def same(path: tuple[str, ...], value: Any, now: Any) -> bool:
    """Whether a suggestion is what the config already says (nothing to write)."""
    if now is None:
        return False
    try:
        if path[-1] == "warmup_seconds":
            return bool(parse_duration(value) == now)
        if isinstance(value, str):
            return bool(parse_size(value) == now)
    except ValueError:
        return False
    if isinstance(value, list):
        return sorted(value) == sorted(now)
    return bool(value == now)


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
                unchanged = " (unchanged)" if same(f.path, f.value, now) else \
                    f" (now: {shown(f.path, now)})"
                lines += _comment(f.evidence + unchanged + tail, indent)
                value = "[" + ", ".join(str(v) for v in f.value) + "]" \
                    if isinstance(f.value, list) else str(f.value)
                prefix = "" if f.write else "# "
                lines.append(" " * indent + f"{prefix}{key}: {value}")
    return "\n".join(lines)


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent + "# "
    return textwrap.wrap(text, WRAP - len(pad), initial_indent=pad, subsequent_indent=pad + "  ",
                         break_on_hyphens=False, break_long_words=False)


# --- --write -------------------------------------------------------------------------------

# Indentations tried for a round trip that gives the file back byte for byte:
# (mapping, sequence, offset of the dash), ruamel.yaml's default first.
INDENTS = ((2, 2, 0), (2, 4, 2), (4, 4, 0), (4, 6, 4), (4, 4, 2), (3, 3, 0))


def write(path: Path, config: Config, tunings: list[ModelTuning]) -> int:
    changes = [(t.model, f) for t in tunings for f in t.findings
               if f.write and f.value is not None and f.path != ("note",)
               and not same(f.path, f.value, current(config.models[t.model], f.path))]
    if not changes:
        print(f"# {path}: nothing to change", file=sys.stderr)
        return 0
    try:
        raw = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TuneError(f"cannot read {path}: {exc}") from None
    crlf = "\r\n" in raw
    if crlf and raw.count("\r\n") != raw.count("\n"):
        raise TuneError(f"{path}: mixes CRLF and LF line endings; left unchanged (make them "
                        "one kind, or add the values above by hand)")
    old = raw.replace("\r\n", "\n") if crlf else raw
    yaml, doc = _load_round_trip(path, old)
    for model, finding in changes:
        _set(doc, model, finding)
    new = _dump(yaml, doc, old)
    problems = check_text(new, path)
    if problems:
        hint = ""
        if any("supervisor.runtime_dir" in p and "by this user" in p for p in problems):
            hint = ("\n  (`--write` runs `check`'s host checks as this user: run it as the "
                    "daemon's user, or as root; or apply the values above by hand)")
        raise TuneError(f"{path} left unchanged: `check` refuses the tuned file:\n  " +
                        "\n  ".join(problems) + hint)
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=f"{path} (tuned)"))
    notes = []
    if crlf:
        new = new.replace("\n", "\r\n")
        notes.append("CRLF line endings kept")
    try:
        with _prepared(path, new, keep=True) as (commit, target, was):
            if not was.st_mode & 0o222:
                notes.append(f"{target} was read-only (mode "
                             f"{stat.S_IMODE(was.st_mode):04o}): replaced, mode kept")
            sys.stdout.write(diff)
            commit()
    except OSError as exc:
        raise TuneError(f"cannot write {path}: {exc.strerror or exc}; left unchanged") \
            from None
    for note in notes:
        print(f"# {note}", file=sys.stderr)
    print(f"# wrote {path}; `tfsupervisor reload -c {path}` applies it", file=sys.stderr)
    return 0


def _load_round_trip(path: Path, old: str) -> tuple[Any, Any]:
    """ruamel.yaml set up so that the file, loaded and dumped unchanged, is the same text
    (else the diff would not be only the change): TuneError when no setting does that."""
    from ruamel.yaml import YAML

    lines = [line.strip() for line in old.splitlines()]
    content = [line for line in lines if line and not line.startswith("#")]
    first_difference = ""
    for mapping, sequence, offset in INDENTS:
        yaml = YAML()
        yaml.preserve_quotes = True
        yaml.width = 4096
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        yaml.explicit_start = bool(content) and content[0] == "---"
        try:
            doc = yaml.load(old)
        except Exception as exc:  # it validated with PyYAML: ruamel reads YAML 1.2 (rare)
            raise TuneError(f"{path}: cannot be edited in place ({type(exc).__name__}); add "
                            "the values above by hand") from None
        _keep_anchors(doc)
        again = _dump(yaml, doc, old)
        if again == old:
            return yaml, doc
        if not first_difference:
            at = next((i for i, (a, b) in enumerate(zip(old.splitlines(), again.splitlines(),
                                                        strict=False)) if a != b),
                      min(len(old.splitlines()), len(again.splitlines())))
            was = old.splitlines()[at] if at < len(old.splitlines()) else "(end of file)"
            first_difference = f"line {at + 1}: {was.strip()[:60]!r}"
    raise TuneError(f"{path}: left unchanged: ruamel.yaml cannot write it back as it is "
                    f"({first_difference} would change besides the tuned values); add the "
                    "values above by hand")


def _keep_anchors(doc: Any) -> None:
    """ruamel.yaml drops an anchor no alias uses: keep every one the file names."""
    seen: set[int] = set()
    stack = [doc]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = getattr(getattr(node, "anchor", None), "value", None)
        if name:
            node.yaml_set_anchor(name, always_dump=True)
        if isinstance(node, dict):
            stack += node.values()
        elif isinstance(node, list):
            stack += node


def _dump(yaml: Any, doc: Any, old: str) -> str:
    stream = io.StringIO()
    yaml.dump(doc, stream)
    text = stream.getvalue()
    # ruamel.yaml drops a document-end marker: put a final `...` back where there was one
    tail = [line.strip() for line in old.splitlines() if line.strip()]
    if tail and tail[-1] == "..." and not text.rstrip().endswith("\n..."):
        text += "...\n"
    return text


def _set(doc: Any, model: str, finding: Finding) -> None:
    """Put one value into models.MODEL.PATH, refusing to write into a mapping other keys
    share through a YAML anchor: an alias (``*name``) or a merge key (``<<: *name``)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    shared = _shared(doc)
    node = doc["models"][model]
    where = f"models.{model}"
    for key in ("", *finding.path[:-1]):
        if key:
            own = getattr(node, "_ok", None)
            if key in node and own is not None and key not in own:
                base = next((_anchor(b) for b in getattr(node, "merge", []) if key in b), None)
                raise TuneError(
                    f"{where}.{key} comes from a merge key (`<<: *{base or '...'}`) in {where}: "
                    f"writing {finding.path[-1]} there would change the anchored mapping and "
                    f"every model merging it; give {where} its own `{key}:` mapping and run "
                    "`tune --write` again")
            if not isinstance(node.get(key), dict):
                node[key] = CommentedMap()
            node = node[key]
            where = f"{where}.{key}"
        paths = shared.get(id(node), [])
        if len(paths) > 1:
            anchor = _anchor(node) or "name"
            raise TuneError(
                f"{where} is one mapping shared through a YAML anchor (&{anchor} at "
                f"{paths[0]}) with {', '.join(p for p in paths if p != where)}: writing "
                f"{finding.path[-1]} there would change them all, the last model written "
                f"winning. Un-share it: write the mapping out in full in place of each alias "
                f"*{anchor} ({', '.join(paths[1:])}), or have each model merge the common "
                f"keys into its own mapping (`{where.rsplit('.', 1)[-1]}: {{<<: *{anchor}}}`), "
                "and run `tune --write` again")
    value: Any = finding.value
    if isinstance(value, list):
        value = CommentedSeq(value)
        value.fa.set_flow_style()
    node[finding.path[-1]] = value


def _anchor(node: Any) -> str | None:
    name = getattr(getattr(node, "anchor", None), "value", None)
    return name if isinstance(name, str) else None


def _shared(doc: Any) -> dict[int, list[str]]:
    """Every mapping reached more than once (an anchor and its aliases, or a base merged
    with ``<<``), by id, with the dotted paths that reach it: the anchor's first."""
    seen: dict[int, list[str]] = {}

    def walk(node: Any, where: str) -> None:
        if not isinstance(node, dict | list):
            return
        paths = seen.setdefault(id(node), [])
        paths.append(where)
        if len(paths) > 1:
            return
        if isinstance(node, dict):
            own = getattr(node, "_ok", None)
            for key, value in node.items():
                if own is None or key in own:
                    walk(value, f"{where}.{key}" if where else str(key))
            for base in getattr(node, "merge", []):
                walk(base, f"{where}.<<" if where else "<<")
        else:
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(doc, "")
    return {k: v for k, v in seen.items() if len(v) > 1}


def check_text(text: str, path: Path) -> list[str]:
    """What `tfsupervisor check` would say against this text as the file at ``path``."""
    from supervisor.cli.preflight import preflight

    try:
        config = parse_config(text, path)
    except ConfigErrors as errors:
        return [str(e) for e in errors.errors]
    return [str(f) for f in preflight(config) if f.error]


@contextlib.contextmanager
def _prepared(path: Path, text: str, keep: bool,
              overwrite: bool = True) -> Iterator[tuple[Callable[[], None], Path,
                                                      os.stat_result]]:
    """A temporary file beside ``path`` (a symlink's target) holding ``text``; yields
    (commit, target, the stat of what it replaces, or of the new file). ``keep``: with the
    mode, owner and group of the file it replaces (TuneError when this user cannot give it
    them); otherwise the mode open() would give a new file. ``commit`` renames it over the
    target, or with ``overwrite`` False links it only where nothing is (FileExistsError
    otherwise). Without a commit, nothing is left behind."""
    target = Path(os.path.realpath(path))
    try:
        was: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        was = None
    if was is not None and not stat.S_ISREG(was.st_mode):
        raise TuneError(f"{path}: not a regular file; left alone")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    done = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        if keep and was is not None:
            made = os.stat(tmp)
            if (made.st_uid, made.st_gid) != (was.st_uid, was.st_gid):
                try:
                    os.chown(tmp, was.st_uid, was.st_gid)
                except PermissionError:
                    raise TuneError(
                        f"{path} belongs to uid {was.st_uid}, gid {was.st_gid}; this user "
                        f"(uid {os.geteuid()}) cannot give the rewritten file that owner and "
                        "group, and the service might then not read it: left unchanged. "
                        "Run `tune --write` as its owner or as root, or apply the values "
                        "above by hand") from None
            mode = stat.S_IMODE(was.st_mode)
        else:  # a new file: the mode open() would give it (mkstemp's is 0600)
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # after chown, which clears set-id bits

        def commit() -> None:
            nonlocal done
            if overwrite:
                os.replace(tmp, target)
            else:
                os.link(tmp, target)  # fails where a file appeared since: never clobbers
                os.unlink(tmp)
            done = True

        yield commit, target, was if was is not None else os.stat(tmp)
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
