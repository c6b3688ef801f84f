"""How a `tfsupervisor` command ends: one exit status per kind of failure, the same in
every command (docs/operations.md, "The command's exit statuses"), and the one way a model
that is not served is reported."""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class CliExit(IntEnum):
    OK = 0
    # What was given cannot be used: a config file missing or invalid, no such model, an
    # input file that cannot be read, a request or reload the supervisor refused as bad.
    # Under `status --ready`: not ready.
    REFUSED = 1
    USAGE = 2  # a bad command line (argparse's own status)
    UNREACHABLE = 3  # no supervisor answered at the endpoint
    FAILED = 4  # the supervisor took the request and it failed (the error code says why)


# The protocol's codes that mean "what you sent is wrong", not "it failed".
REFUSALS = frozenset({"unknown_model", "bad_request"})


def no_such_model(name: str, served: Iterable[str], where: str = "") -> str:
    """The one message for a model that is not served, naming those that are."""
    names = ", ".join(sorted(served)) or "no model"
    return f"no model named {name!r}{where} (served: {names})"


def is_unknown_model(message: str) -> bool:
    """Whether a control command's error is the daemon's 'no model named ...'."""
    return message.startswith("no model named")
