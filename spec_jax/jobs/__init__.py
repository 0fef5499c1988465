"""Library entry points of the launchers: each `run(config, workdir)` is one job.

The absl mains in launch/ only parse flags and call these, so tests import them directly.
"""
