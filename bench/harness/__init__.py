"""The one bench harness: every side-by-side bench is a workload and a table on top of it.

- ``server``: a started ``Server`` (start, ready, stop, its process tree's CPU and memory),
  started from a ``Variant`` of a ``Workload``: tfsupervisor (its ZeroMQ endpoint or its HTTP
  front) or a peer's server script.
- ``transport``: how a client reaches a server, one request at a time: ``Zmq`` (the
  supervisor's ``Client``) or ``Http`` (a keep-alive connection per client thread, with a
  body ``Codec``: raw bytes, JSON rows, or the Open Inference Protocol v2).
- ``load``: forked client processes, closed loop (N callers back to back) and open loop
  (Poisson arrivals, latency from each scheduled send); a ``Tally`` of what they saw.
- ``workload``: what a bench serves: its requests, how an answer is checked, the peers'
  model-loading script, the tfsupervisor config; and the ``Variant`` records that name
  each server with its behaviour as fields (front, batch wait, adaptive).
- ``scripts``: the peers' server scripts (mosec, LitServe, Ray Serve), shared by the
  workloads, which add their own ``forward_raw`` / ``from_json`` / ``predict_rows``.
"""
