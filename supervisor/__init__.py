"""tfsupervisor's supervisor side, in six role packages whose imports point down only:
cli/ (the command) over daemon/ (the I/O shell) over core/ (every decision, no sockets) over
config/ over shared/ (the wire vocabulary worker/ uses too); client/ imports shared/ only.

Nothing in this package imports TensorFlow, directly or indirectly. Public import paths:
supervisor.client, supervisor.aclient, supervisor.testing, supervisor.protocol (TensorSpec
for handlers that declare their inputs)."""
