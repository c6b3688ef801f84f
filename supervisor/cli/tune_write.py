"""`tfsupervisor tune --write`: the tuned values put into the user's config file, keeping
its comments, layout, line endings, owner, group and mode; refused where a value would land
in a node shared through an anchor or a merge key, or where the file cannot be written back
unchanged; written atomically, and only once `check` accepts the result.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.config.keys import Config, ModelConfig
from supervisor.config.loading import parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.config.units import format_size, parse_duration, parse_size
from supervisor.core.tuning import (
    Finding,
    ModelTuning,
)


class TuneError(Exception):
    """Said to the operator as it is, exit 1."""


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
        with prepared(path, new, keep=True) as (commit, target, was):
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
def prepared(path: Path, text: str, keep: bool,
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
