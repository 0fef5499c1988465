"""The paper's chain setup (docs/paper.md §1, §4, §5.2): Qwen2.5-72B-Instruct with a
Qwen2.5-0.5B-Instruct draft, gamma 10, T 0.7, max_new_tokens 2048, three seeds; MATH,
MBPP+, INCLUDE and BFCL parallel_multiple with the paper's grids.

    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py:v5p --dry_run
    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py:h100x8 \
        --config.model=/models/Qwen2.5-72B-Instruct --config.draft=/models/Qwen2.5-0.5B-Instruct
    python launch/aot.py --config configs/experiments/qwen25_72b_chain.py:v5p --topology v5p:2x2x1
    python launch/aot.py --config configs/experiments/qwen25_72b_chain.py:v5e32_int8 \
        --topology v5e:4x8

The argument picks the hardware (batch 8, prompts and outputs up to 2048 tokens: 4,107
cache slots a row; per-chip memory from `launch/aot.py --dry_run`, spec_jax/costs/memory.py,
and docs/performance.md "Compiled for TPU"):

  ''          one device (the weights alone are 145 GB in bf16: no single chip holds them)
  v5p         a v5p-8 slice (4 chips, one host), bf16, mesh 1 x 4: the chain loop compiles
              (launch/aot.py, v5p:2x2x1) to 41.6 GiB of 95 a chip (estimated 42.4)
  v5e8_int8   a v5e-8 slice (one host, 8 chips), int8 weights, mesh 1 x 8: the chain
              loop compiles to 14.5 GiB of 16 a chip (estimated 14.4), attention in query
              blocks; each chip holds twice v5e-16's share of the target, so the replicated
              draft costs it relatively less (docs/performance.md: the analytic roofline)
  v5e16_int8  a v5e-16 slice (4 hosts x 4 chips), int8 weights, one mesh over the hosts,
              model 16 (each of the 8 KV heads held twice: sharding.kv_repeat): compiles
              to 10.8 GiB of 16 a chip (estimated 10.2), with attention in query blocks
              (models/attention.py; 16.5 GiB before: the draft's prefill scores over the
              whole 2,048-token prompt, its 14 heads whole on every chip)
  v5e32_int8  a v5e-32 slice (8 hosts x 4 chips), int8, data 2 x model 16 (4 rows a data
              shard): compiled to 11.2 GiB of 16 a chip before the query blocks
              (estimated 7.8 with them)
  h100x8      one node of 8 H100 80 GB, bf16, mesh 1 x 8: ~23 GiB of 80 a GPU (estimated)

int8 (`c.weights = 'int8'`) is the model stack's weight-only int8 (spec_jax/models/quant.py;
per-output-channel float32 scales), quantized from the bf16 checkpoint as it loads
(`checkpoints.load(quantize='int8')`); the AOT job and the estimate compile and size the
same weights. The paper ran GPTQ-Int8 checkpoints; the bf16 weights of the same models
are used here (quantized at load in the int8 variants).
The tasks read the paper's own items
(`paper.TASK_SOURCES`: source 'fast_hsd' for MATH, the first 500 *train* rows of
competition_math, 240 bundled and the rest from the hub; INCLUDE's exact 220; BFCL's 200;
MBPP+ v0.2.0 from the hub).
The two embedding tables differ in size (152,064 and 151,936 rows; the paper clamps both to
the smaller): spec_jax fits the draft's to the target's (drafters.fit_vocab).
"""

import ml_collections

from spec_jax import sharding
from spec_jax.eval import paper
from spec_jax.jobs import evaluate

# arg -> (mesh data, model, hosts, weights: '' the checkpoint's bf16, or 'int8').
HARDWARE = {
    '': (1, 1, 'local', ''),
    'v5p': (1, 4, 'local', ''),
    'v5e8_int8': (1, 8, 'local', 'int8'),
    'v5e16_int8': (1, 16, 'all', 'int8'),
    'v5e32_int8': (2, 16, 'all', 'int8'),
    'h100x8': (1, 8, 'local', ''),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or ''
    if arg not in HARDWARE:
        raise ValueError(f'unknown config arg {arg!r}; valid: {tuple(HARDWARE)}')
    c = evaluate.default_config()
    c.name = 'qwen25_72b_chain'
    c.model = 'Qwen/Qwen2.5-72B-Instruct'
    c.draft = 'Qwen/Qwen2.5-0.5B-Instruct'
    c.dtype = 'bfloat16'
    c.mode = 'chain'
    c.num_draft = 10
    c.grid = paper.grid(paper.GRIDS)  # Every rule at every value.
    c.seeds = (0, 1, 2)
    c = evaluate.paper_setup(c)
    data, model, hosts, quant = HARDWARE[arg]
    c.mesh = sharding.mesh_config(data, model, hosts)
    if quant:
        c.weights = quant  # Weight-only int8, quantized at load (docs/quantization.md).
    return c
