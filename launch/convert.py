"""Convert a checkpoint into an orbax one, once, streaming tensor by tensor.

    python launch/convert.py --source /models/Llama-3.1-8B-Instruct --out /ckpt/llama8b \
        --dtype bfloat16
    python launch/convert.py --source embedded --out /tmp/smollm2_orbax
    python launch/convert.py --source /mnt/models/Qwen2.5-72B-Instruct \
        --out gs://bucket/ckpt/qwen72b --dtype bfloat16 --mesh_model -1 --mesh_hosts all \
        --coordinator auto                     # every host of a pod slice, the same command

The result loads with `checkpoints.load(out, mesh=...)` (or as any job's `model`), each
device reading its own shards; --out may be a gs:// URL. With --mesh_hosts all every
process reads only the regions of each tensor its devices keep and writes its own shards
(launch/tpu/convert.sh runs it so). See `spec_jax.checkpoints.orbax_io.convert_to_orbax`.
"""

from absl import app, flags, logging

from spec_jax import checkpoints, distributed, sharding

_SOURCE = flags.DEFINE_string('source', None, 'HF directory or hub id, a .gguf, or embedded.')
_OUT = flags.DEFINE_string('out', None, 'Output directory or gs:// URL (empty or absent).')
_DTYPE = flags.DEFINE_enum('dtype', '', ['', 'float32', 'bfloat16', 'float16'],
                           "Parameter dtype written ('' keeps the checkpoint's).")  # fmt: skip
_DATA = flags.DEFINE_integer('mesh_data', 1, "Mesh 'data' size the tensors are placed on.")
_MODEL = flags.DEFINE_integer('mesh_model', 1, "Mesh 'model' size (-1: every device).")
_HOSTS = flags.DEFINE_enum('mesh_hosts', 'local', list(sharding.HOSTS),
                           "'all': one mesh over every process's devices (several hosts "
                           'convert together, each reading and writing its own shards).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace a non-empty output directory.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator', '', "Several processes: process 0's host:port, or 'auto' (TPU pods, "
    f'SLURM); default ${distributed.ENV_COORDINATOR}, else one process.'
)  # fmt: skip
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0, 'With --coordinator host:port.')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1, 'With --coordinator host:port.')
flags.mark_flags_as_required(['source', 'out'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.WARNING)  # Orbax logs every partial save at INFO.
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    mesh = sharding.make_mesh(sharding.mesh_config(_DATA.value, _MODEL.value, _HOSTS.value))
    path = checkpoints.convert_to_orbax(
        _SOURCE.value, _OUT.value, _DTYPE.value or None, mesh, overwrite=_OVERWRITE.value
    )
    if distributed.is_main():
        print(f'wrote {path}')


if __name__ == '__main__':
    app.run(main)
