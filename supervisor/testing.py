"""Public import path for the test helpers: ``from supervisor.testing import start_supervisor``.

The code lives in supervisor/client/testing.py.
"""

from supervisor.client.testing import Supervisor, free_port, short_tmpdir, start_supervisor

__all__ = ["Supervisor", "free_port", "short_tmpdir", "start_supervisor"]
