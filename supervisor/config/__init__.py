"""Configuration: the keys (declared once in keys.py, on the engine of settings.py and
units.py), loading the YAML file (loading.py) and the worker spec handed to each worker
(worker_spec.py).

Rule: imports supervisor.shared only. Only loading.py imports yaml.
"""
