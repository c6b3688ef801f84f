"""The I/O shell around the core: the event loop and its sockets, signals, control endpoints,
reporting and metrics, systemd notify, memory sampling (psutil, NVML), worker output, the
instance lock, startup and security.

Rule: imports supervisor.core, supervisor.config and supervisor.shared; never the CLI or
the client.
"""
