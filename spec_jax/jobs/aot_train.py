"""A train_draft config's training steps in shapes, for the AOT job (spec_jax/jobs/aot.py):
the jitted step `fit` runs and its arguments as ShapeDtypeStructs on a mesh, at the
config's batch and sequence length, nothing loaded or initialized.

The steps a config trains with (`fit.fit_draft_lm`, `fit.fit_eagle3`):
  draft_lm  'ce' (hard labels) or 'topk' (stored top-k labels) for its first
            `fit.ce_step_count` steps, 'kl' (the target's logits, one teacher forward) after
  eagle3    'ttt_cached' (stored taps and top-k labels) with `train.teacher_topk` > 0, else
            'ttt' (the target runs every step)
Placement as `configs/bench_mesh.py` measures it: the target and the trained state (params
and optimizer moments) by the sharding rules, the batch's rows over 'data'.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding

from spec_jax import sharding
from spec_jax.checkpoints.convert import param_shapes
from spec_jax.jobs.abstract import model_config, place
from spec_jax.models import eagle3 as e3
from spec_jax.train import core, distill, fit
from spec_jax.train import eagle3 as train_e3

TARGET_DTYPE = 'float32'  # train_draft loads its target in fp32 (jobs/train_draft.py).


@dataclasses.dataclass(frozen=True)
class TrainStep:
    """One jitted training step and its abstract arguments (`step.lower(*args)`)."""

    name: str
    step: object
    args: tuple
    tokens: int  # Tokens a step trains on (batch x sequence length).


def is_train_config(c: ml_collections.ConfigDict) -> bool:
    return 'kind' in c and 'train' in c and 'target' in c


def steps_of(c: ml_collections.ConfigDict, mesh: Mesh) -> list[TrainStep]:
    """The training steps config `c` runs (module docstring), placed on `mesh`."""
    target = model_config(c.target, TARGET_DTYPE)
    t = c.train
    opt = core.make_optimizer(t.lr, t.steps, t.warmup, t.clip, t.weight_decay)
    target_params = place(param_shapes(target), mesh)
    rows = NamedSharding(mesh, sharding.RULES.spec('b.', mesh))
    b, n = t.batch_size, t.seq_len
    batch = (
        jax.ShapeDtypeStruct((b, n), jnp.int32, sharding=rows),
        jax.ShapeDtypeStruct((b, n), jnp.bool_, sharding=rows),
        jax.ShapeDtypeStruct((b, n), jnp.bool_, sharding=rows),
    )
    k = fit.soft_label_count(c)
    topk = tuple(jax.ShapeDtypeStruct((b, n, k), dt, sharding=_rows3(mesh))
                 for dt in (jnp.int32, jnp.float32))  # fmt: skip
    if c.kind == 'draft_lm':
        dcfg = fit.draft_lm_config(c, target)
        state = _state(param_shapes(dcfg), opt, mesh)
        out = []
        if fit.ce_step_count(t):
            if k:
                step = distill.make_topk_step(dcfg, opt)
                out.append(TrainStep('train_topk', step, (state, *batch, *topk), b * n))
            else:
                step = distill.make_ce_step(dcfg, opt)
                out.append(TrainStep('train_ce', step, (state, *batch), b * n))
        if fit.ce_step_count(t) < t.steps:
            step = distill.make_train_step(target, dcfg, opt, t.temperature)
            out.append(TrainStep('train_kl', step, (target_params, state, *batch), b * n))
        return out
    m = c.model
    sizes = ('num_heads', 'num_kv_heads', 'head_dim', 'mlp_width')
    hcfg = e3.Eagle3Config.for_target(
        target, m.draft_vocab_size, **{s: m[s] for s in sizes if m.get(s)}
    )
    head = jax.eval_shape(lambda: e3.init_params(hcfg, jax.random.PRNGKey(0)))
    state = _state(head, opt, mesh)
    whole = NamedSharding(mesh, jax.sharding.PartitionSpec())
    ids = (jax.ShapeDtypeStruct((m.draft_vocab_size,), jnp.int32, sharding=whole),
           jax.ShapeDtypeStruct((target.vocab_size,), jnp.bool_, sharding=whole))  # fmt: skip
    ttt = (t.ttt_steps, t.step_weight)
    if k:
        taps = jax.ShapeDtypeStruct((b, n, 3, target.width), jnp.float32, sharding=_rows3(mesh, 4))
        step = train_e3.make_cached_train_step(hcfg, opt, *ttt)
        args = (target_params['embed_vd'], *ids, state, *batch, taps, *topk)
        return [TrainStep('train_ttt_cached', step, args, b * n)]
    step = train_e3.make_train_step(target, hcfg, opt, *ttt)
    return [TrainStep('train_ttt', step, (target_params, *ids, state, *batch), b * n)]


def _state(params, opt, mesh: Mesh) -> dict:
    """The trained state `fit` carries (params, optimizer state, step), placed by the rules."""
    state = dict(params=params, opt_state=jax.eval_shape(opt.init, params),
                 step=jax.ShapeDtypeStruct((), jnp.int32))  # fmt: skip
    return place(state, mesh)


def _rows3(mesh: Mesh, ndim: int = 3) -> NamedSharding:
    return NamedSharding(mesh, sharding.RULES.spec('b' + '.' * (ndim - 1), mesh))
