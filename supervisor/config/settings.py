"""A small declarative settings engine.

Every setting is declared once, as a dataclass field made with :func:`setting`, carrying its
kind (type, parsing, validation, unit), default and help text. From those declarations come
parsing with path-named errors, did-you-mean for unknown keys, the JSON schema and the docs
table. Nothing here knows about tfsupervisor's own keys: see ``keys.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from supervisor.config.units import MAX_DURATION, MAX_SIZE, parse_duration, parse_size

T = TypeVar("T")


class ConfigError(Exception):
    """One invalid value, named by its dotted path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class ConfigErrors(Exception):
    """All the errors found in one configuration, so the operator fixes them in one go."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


# The largest integer any setting takes: what an int64 holds (sizes, counts, limits).
MAX_INT = MAX_SIZE


def _got(value: object, limit: int = 80) -> str:
    """A received value as an error message shows it: short, printable, and never an error
    itself (a hostile file may hold huge ints, control characters or deep nesting)."""
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        # str() refuses ints of more than 4300 digits; 14000 bits stay well under that.
        digits = len(str(abs(value))) if value.bit_length() < 14000 else "over 4000"
        return f"an integer of {digits} digits"
    try:
        printable = isinstance(value, str) and value.isprintable()
        text = f'"{value}"' if printable else repr(value)
    except Exception:  # RecursionError, ints past str()'s digit limit inside a list, ...
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _key(key: object) -> str:
    """A mapping key as a path component, bounded like _got."""
    if isinstance(key, str) and len(key) <= 80 and key.isprintable():
        return key
    return _got(key)


class Kind:
    """How one setting's raw YAML value is parsed, validated and described."""

    expected: str = "a value"
    unit: str = ""

    def parse(self, value: object, path: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def fail(self, value: object, path: str) -> ConfigError:
        return ConfigError(path, f"expected {self.expected}, got {_got(value)}")


class Int(Kind):
    def __init__(self, minimum: int = 0, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum
        if maximum is not None:
            self.expected = f"an integer from {minimum} to {maximum}"
        else:
            self.expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum or \
                (self.maximum is not None and value > self.maximum):
            raise self.fail(value, path)
        if value > MAX_INT:
            raise ConfigError(path, f"expected {self.expected} of at most 2**63-1, got "
                              f"{_got(value)}")
        return value

    def schema(self) -> dict[str, Any]:
        maximum = MAX_INT if self.maximum is None else self.maximum
        return {"type": "integer", "minimum": self.minimum, "maximum": maximum}


class Float(Kind):
    def __init__(self, minimum: float = 0.0, maximum: float | None = None,
                 expected: str | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum
        upper = f" and <= {maximum}" if maximum is not None else ""
        # ``expected``: where a check() narrows the range further, the docs say so too
        self.expected = expected or f"a number >= {minimum}{upper}"

    def parse(self, value: object, path: str) -> float:
        if isinstance(value, str) and _number_text(value):
            why = _exponent_hint(value) or "write it without quotes"
            raise ConfigError(path, f"expected {self.expected}, got the string {_got(value)}: "
                              f"{why}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(value, path)
        try:
            number = float(value)
        except OverflowError:  # an int past float's range
            raise self.fail(value, path) from None
        if not math.isfinite(number):
            raise ConfigError(path, f"expected a finite number, got {_got(value)}")
        if number < self.minimum or (self.maximum is not None and number > self.maximum):
            raise self.fail(value, path)
        return number

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number", "minimum": self.minimum}
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


def _exponent_hint(value: object) -> str | None:
    """Why a number with an exponent arrived as text: YAML 1.1 reads 1e3 (no dot, no sign)
    as a string, so say so, not just "expected a number"."""
    if isinstance(value, str) and "e" in value.lower() and _number_text(value):
        return f"YAML 1.1 reads a number with an exponent as text unless it has a dot and " \
            f"a signed exponent; write {float(value):.1e}, or the number in full"
    return None


def _with_hint(message: str, value: object) -> str:
    hint = _exponent_hint(value)
    return f"{message}: {hint}" if hint else message


def _number_text(value: str) -> bool:
    """Text that Python reads as a finite number (not "nan" or "inf": those have no
    unquoted spelling that would help)."""
    try:
        return len(value) < 64 and math.isfinite(float(value))
    except ValueError:
        return False


class Bool(Kind):
    expected = "true or false"

    def parse(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(value, path)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


class Str(Kind):
    expected = "a non-empty string"

    def parse(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(value, path)
        _refuse_nul(value, path)
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1}


def _refuse_nul(value: str, path: str) -> None:
    """A NUL character cannot reach the OS: paths, endpoints and environment strings with one
    make os and ZeroMQ calls fail long after the config was accepted."""
    if "\0" in value:
        raise ConfigError(path, f"must not contain a NUL character (\\0), got {_got(value)}")


class Choice(Kind):
    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.expected = "one of " + ", ".join(choices)

    def parse(self, value: object, path: str) -> str:
        if value not in self.choices:
            raise self.fail(value, path)
        assert isinstance(value, str)  # narrowed by the membership test above
        return value

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.choices)}


class Size(Kind):
    expected = "a size such as 512MiB, 2GB or a number of bytes"
    unit = "bytes"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum  # a floor below which nothing could ever be served, say
        if minimum:
            self.expected = f"{self.expected}, at least {_bytes(minimum)}"

    def parse(self, value: object, path: str) -> int:
        try:
            size = parse_size(value)
        except ValueError as exc:  # says which rule: the forms, >= 0, finite, at most 2**63-1
            raise ConfigError(path, _with_hint(f"{exc}, got {_got(value)}", value)) from None
        if size < self.minimum:
            raise ConfigError(path, f"expected at least {_bytes(self.minimum)}, got "
                              f"{_got(value)}")
        return size

    def schema(self) -> dict[str, Any]:
        return {
            "oneOf": [
                {"type": "integer", "minimum": self.minimum, "maximum": MAX_SIZE},
                {"type": "string", "pattern": r"^\s*[0-9.]+\s*([kKmMgGtT]i?[bB]?|[bB])?\s*$"},
            ]
        }


def _bytes(count: int) -> str:
    return "1 byte" if count == 1 else f"{count} bytes"


class Duration(Kind):
    expected = "a duration such as 30s, 5m, 24h or a number of seconds"
    unit = "seconds"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum  # a floor that keeps the daemon out of a busy loop, say
        if minimum:
            self.expected = f"{self.expected}, at least {minimum:g}s"

    def parse(self, value: object, path: str) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:  # says which rule: the forms, >= 0, finite, at most 10 years
            raise ConfigError(path, _with_hint(f"{exc}, got {_got(value)}", value)) from None
        if seconds < self.minimum:
            raise ConfigError(path, f"expected at least {self.minimum:g}s, got {_got(value)}")
        return seconds

    def schema(self) -> dict[str, Any]:
        return {
            "oneOf": [
                {"type": "number", "minimum": self.minimum, "maximum": MAX_DURATION},
                {"type": "string", "pattern": r"^\s*[0-9.]+\s*(ms|s|m|h|d)?\s*$"},
            ]
        }


class Optional(Kind):
    """The inner kind, or null (meaning: off / not set)."""

    def __init__(self, inner: Kind) -> None:
        self.inner = inner
        self.expected = f"{inner.expected} or null"
        self.unit = inner.unit

    def parse(self, value: object, path: str) -> Any:
        return None if value is None else self.inner.parse(value, path)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [self.inner.schema(), {"type": "null"}]}


class ListOf(Kind):
    def __init__(self, inner: Kind, min_items: int = 0) -> None:
        self.inner, self.min_items = inner, min_items
        self.expected = f"a list of {inner.expected}"

    def parse(self, value: object, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list) or len(value) < self.min_items:
            raise self.fail(value, path)
        return tuple(self.inner.parse(v, f"{path}[{i}]") for i, v in enumerate(value))

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.inner.schema(), "minItems": self.min_items}


class FreeMap(Kind):
    """A mapping passed through as-is (handler options), or of strings (environment)."""

    def __init__(self, strings: bool = False) -> None:
        self.strings = strings
        self.expected = "a mapping of names to strings" if strings else "a mapping"

    def parse(self, value: object, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.fail(value, path)
        if self.strings:  # an environment: names and values go to execve
            for key, item in value.items():
                where = f"{path}.{_key(key)}"
                if not key or "=" in key:
                    raise ConfigError(where, "an environment variable name must be non-empty "
                                      "and without '='")
                _refuse_nul(key, where)
                if not isinstance(item, str | int | float) or isinstance(item, bool) or \
                        (isinstance(item, int) and item.bit_length() > 64):
                    raise ConfigError(where, f"expected a string, got {_got(item)}")
                if isinstance(item, str):
                    _refuse_nul(item, where)
            return {k: str(v) for k, v in value.items()}
        return dict(value)

    def schema(self) -> dict[str, Any]:
        if self.strings:
            return {"type": "object", "additionalProperties": {"type": ["string", "number"]}}
        return {"type": "object"}


class Section(Kind):
    """A nested dataclass of settings."""

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.expected = "a mapping"

    def parse(self, value: object, path: str) -> Any:
        return parse_section(self.cls, {} if value is None else value, path)

    def schema(self) -> dict[str, Any]:
        return section_schema(self.cls)


class MapOf(Kind):
    """A mapping of user-chosen names (e.g. model names) to sections."""

    def __init__(self, inner: Kind, key_pattern: str = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$") -> None:
        self.inner, self.key_pattern = inner, key_pattern
        self.expected = "a mapping of names"

    def parse(self, value: object, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(value, path)
        errors: list[ConfigError] = []
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str) or not re.match(self.key_pattern, key):
                errors.append(ConfigError(f"{path}.{_key(key)}", "expected a name of letters, "
                                          "digits, '_', '-' or '.'"))
                continue
            try:
                out[key] = self.inner.parse(item, f"{path}.{key}")
            except ConfigErrors as many:
                errors.extend(many.errors)
            except ConfigError as one:
                errors.append(one)
        if errors:
            raise ConfigErrors(errors)
        return out

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "propertyNames": {"pattern": self.key_pattern},
            "additionalProperties": self.inner.schema(),
        }


def setting(kind: Kind, default: Any, help: str) -> Any:
    """Declare one setting as a dataclass field: kind, default and help text in one place."""
    if isinstance(default, dict | list):
        factory: Callable[[], Any] = lambda: type(default)(default)  # noqa: E731
        return dataclasses.field(default_factory=factory, metadata={"kind": kind, "help": help})
    if isinstance(kind, Section) and default is None:
        return dataclasses.field(default_factory=kind.cls, metadata={"kind": kind, "help": help})
    return dataclasses.field(default=default, metadata={"kind": kind, "help": help})


def section_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]


def parse_section(cls: type[T], raw: object, path: str) -> T:
    """Parse a mapping into the dataclass ``cls``, collecting every error with its path."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"expected a mapping, got {_got(raw)}")
    fields = {f.name: f for f in section_fields(cls)}
    errors: list[ConfigError] = []
    for key in raw:
        if key not in fields:
            shown = _key(key)
            hint = difflib.get_close_matches(shown, list(fields), n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            known = ", ".join(sorted(fields))
            errors.append(ConfigError(_join(path, shown), f"unknown key{extra}; known: {known}"))
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in raw:
            continue
        try:
            values[name] = field.metadata["kind"].parse(raw[name], _join(path, name))
        except ConfigErrors as many:
            errors.extend(many.errors)
        except ConfigError as one:
            errors.append(one)
    if not errors:
        instance = cls(**values)
        check = getattr(instance, "check", None)
        errors.extend(check(path) if check else [])
        if not errors:
            return instance
    raise ConfigErrors(errors)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def section_schema(cls: type[Any]) -> dict[str, Any]:
    """JSON schema (draft 2020-12 subset) of a settings dataclass."""
    props: dict[str, Any] = {}
    for field in section_fields(cls):
        kind: Kind = field.metadata["kind"]
        prop = dict(kind.schema())
        unit = f" (unit: {kind.unit})" if kind.unit else ""
        prop["description"] = field.metadata["help"] + unit
        default = _default_of(field)
        if default is not None and not dataclasses.is_dataclass(default):
            prop["default"] = default
        props[field.name] = prop
    return {"type": "object", "properties": props, "additionalProperties": False}


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def describe(cls: type[Any], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (key, expected, default, help) for the docs, nested sections flattened."""
    rows: list[tuple[str, str, str, str]] = []
    for field in section_fields(cls):
        kind: Kind = field.metadata["kind"]
        key = _join(prefix, field.name)
        if isinstance(kind, Section):
            continue  # nested sections get their own table
        default = _default_of(field)
        shown = "null" if default is None else repr(default)
        rows.append((key, kind.expected, shown, field.metadata["help"]))
    return rows
