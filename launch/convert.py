"""Convert a checkpoint into an orbax one, once, streaming tensor by tensor.

    python launch/convert.py --source /models/Llama-3.1-8B-Instruct --out /ckpt/llama8b \
        --dtype bfloat16
    python launch/convert.py --source embedded --out /tmp/smollm2_orbax

The result loads with `checkpoints.load(out, mesh=...)` (or as any job's `model`), each
device reading its own shards. See `spec_jax.checkpoints.orbax_io.convert_to_orbax`.
"""

from absl import app, flags, logging

from spec_jax import checkpoints, sharding

_SOURCE = flags.DEFINE_string('source', None, 'HF directory or hub id, a .gguf, or embedded.')
_OUT = flags.DEFINE_string('out', None, 'Output directory (must be empty or absent).')
_DTYPE = flags.DEFINE_enum('dtype', '', ['', 'float32', 'bfloat16', 'float16'],
                           "Parameter dtype written ('' keeps the checkpoint's).")  # fmt: skip
_DATA = flags.DEFINE_integer('mesh_data', 1, "Mesh 'data' size the tensors are placed on.")
_MODEL = flags.DEFINE_integer('mesh_model', 1, "Mesh 'model' size (-1: every device).")
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace a non-empty output directory.')
flags.mark_flags_as_required(['source', 'out'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.WARNING)  # Orbax logs every partial save at INFO.
    mesh = sharding.make_mesh(sharding.mesh_config(_DATA.value, _MODEL.value))
    path = checkpoints.convert_to_orbax(
        _SOURCE.value, _OUT.value, _DTYPE.value or None, mesh, overwrite=_OVERWRITE.value
    )
    print(f'wrote {path}')


if __name__ == '__main__':
    app.run(main)
