"""Evaluation tasks: each family module has a `TASKS` dict from task names to classes
meeting `base.Task` (math, code, bfcl, include)."""
