"""Evaluation: tasks (prompt, extraction, scoring), sandboxed code execution, and (next) the
runner that evaluates rules against their matched baselines, metrics and reports."""
