"""Public import path for the asyncio client: ``from supervisor.aclient import AsyncClient``.

The code lives in supervisor/client/aclient.py.
"""

from supervisor.client.aclient import AsyncClient

__all__ = ["AsyncClient"]
