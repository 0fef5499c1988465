"""The statistics of an evaluation in one room: the timing design, the paired estimators,
the tests and the verdict text (docs/eval.md, "Verdicts"). Each module says which estimand
each printed number is.

Modules:
  design    the method orders of a task group's batches, relabelled at random per pair
            of batches from the run's seed (timing.order reads it), and their units
  paired    paired estimators: speedups (geometric mean of per-batch tokens/s ratios),
            Δs against the matched baseline on shared samples (score, ΔBE, ΔTV: ratios
            of sums, their linearised per-item values), with their intervals and spread
  verdicts  the tests (McNemar's exact p, Tango's score interval of a score gap, the
            t read-back, the margin test of ΔBE, the slope test) and the verdict text,
            Holm over a run's family

The findings (`spec_jax.eval.findings`), the engine rules' lines and the claims call them.
"""
