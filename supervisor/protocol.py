"""Public import path for what a handler declares: ``from supervisor.protocol import
TensorSpec`` (a handler's ``inputs`` / ``outputs``), kept from the flat layout.

The wire protocol lives in supervisor/shared/protocol.py.
"""

from supervisor.shared.protocol import TensorSpec

__all__ = ["TensorSpec"]
