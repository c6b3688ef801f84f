"""Admission at the door: a client's INFER message becomes a Job, or a clear refusal."""

from __future__ import annotations

from supervisor.pool import ModelState
from supervisor.protocol import (
    BAD_REQUEST,
    UNKNOWN_MODEL,
    Frame,
    Message,
    ProtocolError,
    TensorSpec,
    check_frames,
    check_specs,
    parse_specs,
)
from supervisor.router import Job


class Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def admit(msg: Message, envelope: list[Frame], models: dict[str, ModelState], job_id: int,
          now: float, max_elements: int | None = None) -> Job:
    """Check an INFER request against the model's known input specs; raise Refusal."""
    model = msg.header.get("model")
    if not isinstance(model, str):
        raise Refusal(BAD_REQUEST, "header field 'model' must be a string")
    state = models.get(model)
    if state is None or state.removed:
        served = ", ".join(sorted(n for n, s in models.items() if not s.removed))
        raise Refusal(UNKNOWN_MODEL, f"no model named '{model}' (served: {served})")
    try:
        # From the header and the frame lengths alone: no array is built at the door.
        specs = parse_specs(msg.header.get("inputs"))
        check_frames(specs, msg.arrays, max_elements)
        if state.inputs is not None:
            check_specs(state.inputs, specs)
    except ProtocolError as exc:
        raise Refusal(exc.code, str(exc)) from None
    return Job(id=job_id, model=model, envelope=envelope, client_job_id=msg.job_id,
               inputs=msg.header["inputs"], arrays=msg.arrays, received_at=now,
               deadline=_deadline(msg.header.get("timeout_ms"), now))


def _deadline(timeout_ms: object, now: float) -> float | None:
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or timeout_ms <= 0:
        raise Refusal(BAD_REQUEST, "header field 'timeout_ms' must be a positive number")
    return now + float(timeout_ms) / 1000.0


def specs_to_wire(specs: list[TensorSpec] | None) -> list[dict[str, object]] | None:
    return None if specs is None else [s.to_wire() for s in specs]

