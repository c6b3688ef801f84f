"""tfsupervisor's supervisor side: daemon, router, pool, protocol, client, CLI.

Nothing in this package imports TensorFlow, directly or indirectly."""
