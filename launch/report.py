"""The report of an evaluation's results as they stand (also while the run is going).

python launch/report.py --workdir runs/smollm2_135m
"""

from absl import app, flags

from spec_jax.jobs import evaluate

_WORKDIR = flags.DEFINE_string('workdir', None, 'The evaluation workdir (run.json, results).')
flags.mark_flags_as_required(['workdir'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    evaluate.report_only(_WORKDIR.value)


if __name__ == '__main__':
    app.run(main)
