"""The HTTP front: the Open Inference Protocol v2 (KServe, Triton, MLServer clients, with
Triton's binary tensor extension) and TF Serving's REST API, in front processes the daemon
supervises (supervisor/daemon/fronts.py).

A front is a client of the daemon: it translates HTTP requests into jobs on the frontend
protocol (supervisor.aclient) and the daemon's error codes into HTTP statuses. It holds no
decision of its own, so every promise (one reply, deadlines, backpressure, drain) is the
daemon's. It never imports TensorFlow.

Modules, one concern each: tensors (datatypes, JSON and binary tensor data), errors (codes to
statuses), catalog (what the daemon serves, kept fresh), oip and tfserving (the two APIs),
routes (paths to handlers), server (HTTP/1.1 on asyncio), metrics, main (the process).
"""
