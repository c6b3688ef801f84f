"""Configuration: the keys (keys.py, declared once in settings.py with units.py), loading the
YAML file (loading.py) and the worker spec handed to each worker (worker_spec.py).

Rule: imports supervisor.shared only. Only loading.py imports yaml.
"""
