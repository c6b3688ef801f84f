"""The socket-free core: every decision, no I/O. Events in (request, worker message, worker
exit, tick with the time, reload), actions out (reply, send, spawn, stop, kill, sample).

Rule: imports supervisor.config and supervisor.shared only; no zmq sockets, no yaml, no clock
(time is passed in). That is what lets tests/test_core_model.py drive every interleaving.
"""
