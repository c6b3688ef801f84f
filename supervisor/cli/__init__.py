"""The `tfsupervisor` command: argument parsing and commands (commands.py), rendering of
status and explanations (render.py), and preflight checks for `run` and `check`.

Rule: the top of the arrows; imports any other supervisor package, and nothing imports it but the
``tfsupervisor`` entry point and ``python -m supervisor``.
"""
