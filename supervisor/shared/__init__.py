"""The wire vocabulary the supervisor and its workers share: protocol, transport, padding,
string arrays, the probes' wire form, exit codes and logging.

Rule: modules here import the standard library, numpy, msgpack, pyzmq and structlog, and
each other; never another supervisor package (worker/ imports them too).
"""
