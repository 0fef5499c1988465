"""Evaluation: rules against their matched baselines on tasks (docs/eval.md).

Modules:
  tasks/      base (the Task protocol, Item, Score); math (GSM8K, MATH-500, MATH, AIME:
              math-verify in killable workers, timeouts); code/ (HumanEval, MBPP, MBPP+,
              pass@k); bfcl/ (AST categories with the upstream checker's rules); include
              (multiple choice); speed (the speed sets, unscored); the registry (`make`)
  sandbox/    one contained process per code sample (namespaces, mounts, rlimits, uid drop)
  plan        a rule grid -> methods: AR, lossless SD, the rules, their matched baselines
  timing      the batch plan (one task group a batch), the balanced method orders
              (stats.design), AR's drift monitor, the compile clock
  runner      run(config, workdir): batches -> every method -> score (after the round) -> store;
              warmup (each program run once untimed before its first timed call)
  monitor     the drift monitor judged: steady within x1.10, else a warning naming the cause
  records     results.jsonl (a line per sample; per process, merged by process 0), run.json
  metrics     aggregate(rows, methods): score and interval, block efficiencies, speed, meter;
              outcomes (scoring failures by kind, avg@k / pass@k over seeds)
  stats/      design (the timing design's relabelled orders), paired (per-batch speedups,
              Δs on shared samples, their intervals), verdicts (each from its printed test,
              from MIN_ITEMS on, Holm over the run)
  findings    what a run supports, in sentences with numbers, and what it cannot test;
              engine_rules (each lossy rule against lossless SD too, the flattery, the
              report's "Rules the engines ship")
  acceptance  a draft's teacher-forced greedy acceptance on held-out target text
  report      report.md; metrics_csv (the rows as CSV, read back typed); tables (cells,
              row lookups); plots (the PNGs); machine (the report's header: CPU,
              versions, fingerprint, load, the settings that move a number, the commit)
  paper       the paper's numbers as data (docs/paper.md §5); compare: ours beside them
"""
