"""A config's decoding run in shapes only: the engine, `jax.ShapeDtypeStruct` weights with
their shardings on a mesh, and the loop's inputs, with no checkpoint read
(spec_jax/jobs/aot.py compiles them for a TPU topology; spec_jax/costs/memory.py sizes them).

The engine is built as `decoding.build` builds it, from a generate block (`c.spec`) or an
experiment config (`runner.decoding_block`), with the weights replaced by
`checkpoints.param_shapes` of the model's config: read from a local HF or orbax directory's
config file, a preset ('embedded', 'random:<preset>'), or `KNOWN_MODELS` for the hub ids of
the paper's setups (their config.json, so a plan needs no download). Drafts are placed as
the engine places them (`drafter.rules` from the config's `draft_sharding`: by default
weights on every device, an EAGLE-3 head with its own copy of the target's embedding, the
rows over 'data'; 'heads' also splits their attention over 'model').
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spec_jax import rules, sharding
from spec_jax.checkpoints import eagle_formats, hf, sources
from spec_jax.checkpoints.convert import config_from_dict, param_shapes
from spec_jax.costs import memory
from spec_jax.costs.memory import Plan
from spec_jax.decoding import batching, drafters
from spec_jax.decoding.build import sampler_from_config, tree_shape
from spec_jax.decoding.engine import MODES, Engine
from spec_jax.decoding.state import DecodeSettings
from spec_jax.eval import runner
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig, preset

# config.json of the hub checkpoints the paper's setups name (huggingface.co/<id>).
KNOWN_MODELS = {
    'Qwen/Qwen2.5-72B-Instruct': dict(
        architectures=['Qwen2ForCausalLM'], hidden_size=8192, intermediate_size=29568,
        max_position_embeddings=32768, num_attention_heads=64, num_hidden_layers=80,
        num_key_value_heads=8, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
        vocab_size=152064,
    ),
    'Qwen/Qwen2.5-0.5B-Instruct': dict(
        architectures=['Qwen2ForCausalLM'], hidden_size=896, intermediate_size=4864,
        max_position_embeddings=32768, num_attention_heads=14, num_hidden_layers=24,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
        vocab_size=151936,
    ),
    'meta-llama/Llama-3.1-8B-Instruct': dict(
        architectures=['LlamaForCausalLM'], hidden_size=4096, intermediate_size=14336,
        max_position_embeddings=131072, num_attention_heads=32, num_hidden_layers=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192),
        tie_word_embeddings=False, vocab_size=128256,
    ),
}  # fmt: skip
# config.json of the EAGLE-3 heads the paper's setups name.
KNOWN_HEADS = {
    'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B': dict(
        architectures=['LlamaForCausalLMEagle3'], hidden_size=4096, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=1,
        rms_norm_eps=1e-5, vocab_size=128256, draft_vocab_size=32000,
    ),
}  # fmt: skip
# 'random:<preset>' widens the vocabulary to the embedded tokenizer's (checkpoints.load).
EMBEDDED_VOCAB = ModelConfig.smollm2_135m().vocab_size
STOP_ID = 0  # A stand-in stop token: no shape depends on the tokenizer's ids.


@dataclasses.dataclass(frozen=True)
class Abstract:
    """One decoding mode of a config, in shapes.

    Attributes:
      engine: the engine (its static half decides the program).
      args: `decode_loop`'s arguments after the engine: target params, draft params,
        prompts [B, P], lengths, limits, sample ids (rows over 'data') and the seed key,
        every array a ShapeDtypeStruct with a NamedSharding on `mesh`.
      plan: the same run for `memory.estimate`.
      mesh: the mesh the shardings name.
    """

    engine: Engine
    args: tuple
    plan: Plan
    mesh: Mesh


def model_config(spec: str, dtype: str) -> ModelConfig:
    """The ModelConfig of a checkpoint spec without reading its weights, in `dtype`."""
    spec = os.fspath(spec)
    if spec == sources.EMBEDDED:
        cfg = ModelConfig.smollm2_135m()
    elif spec.startswith('random:'):
        cfg = preset(spec[len('random:') :]).replace(vocab_size=EMBEDDED_VOCAB)
    elif spec in KNOWN_MODELS:
        cfg = hf.config_from_hf(KNOWN_MODELS[spec])
    elif sources.is_orbax_dir(spec):
        cfg = config_from_dict(_json(os.path.join(spec, sources.ORBAX_CONFIG_FILE)))
    elif os.path.isfile(os.path.join(spec, 'config.json')):
        cfg = hf.config_from_hf(_json(os.path.join(spec, 'config.json')))
    else:
        raise ValueError(
            f'model {spec!r}: a plan needs its config without the weights: give a local HF '
            f"or orbax directory, 'embedded', 'random:<preset>', or one of {sorted(KNOWN_MODELS)}"
        )
    return cfg.replace(dtype=dtype, param_dtype=dtype)


def head_config(spec: str, target: ModelConfig) -> e3.Eagle3Config:
    """The Eagle3Config of a head spec ('random', a known hub id or a local directory)."""
    if spec == 'random':
        cfg = e3.Eagle3Config.for_target(target, draft_vocab_size=target.vocab_size)
    elif spec in KNOWN_HEADS:
        cfg = eagle_formats.config_from_json(KNOWN_HEADS[spec], target)
    elif os.path.isfile(os.path.join(spec, 'config.json')):
        cfg = eagle_formats.config_from_json(_json(os.path.join(spec, 'config.json')), target)
    else:
        raise ValueError(
            f"EAGLE-3 head {spec!r}: give 'random', a local head directory, or one of "
            f'{sorted(KNOWN_HEADS)}'
        )
    return cfg.replace(dtype=target.dtype)


def decode_block(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `decoding.build` block of a generate config (`c.spec`) or an experiment config."""
    if 'spec' in c:
        return c
    block = runner.decoding_block(c)
    block.batch_size = c.batch_size  # The experiment's batch (decoding_block leaves it out).
    return block


def plan_of(
    c: ml_collections.ConfigDict, mode: str, mesh_shape: tuple[int, int], quant: str = '',
    prompt_len: int = 0,
):  # fmt: skip
    """(engine, Plan, the draft's params in shapes, unplaced) of config block `c`
    (`decode_block`) in `mode` ('ar', or the config's own 'chain' / 'tree') on a
    (data, model) mesh, its prompts padded to `prompt_len` (default the longest bucket:
    `c.max_prompt_len` rounded up to `c.prompt_bucket`). No mesh is needed: the dry run.

    Raises:
      ValueError: an unknown mode, a model whose config is not at hand, a run longer than
        the model's context; all before anything compiles.
    """
    s = c.spec
    if mode not in MODES:
        raise ValueError(f'mode {mode!r} is not one of {MODES}')
    if mode != 'ar' and mode != s.mode:
        raise ValueError(f"mode {mode!r}: the config decodes in {s.mode!r} (and 'ar')")
    # Each KV head held model / K times where the model axis exceeds K, as loaded.
    target = memory.held(model_config(c.model, c.dtype), mesh_shape[1])
    if quant:  # The model stack's int8 weights (ModelConfig.weights, models/quant.py).
        target = target.replace(weights=quant)
    if c.get('scan_layers'):  # Stacked layers under one scan (checkpoints.load(scan_layers=)).
        target = target.replace(scan_layers=True)
    decode = DecodeSettings(
        max_new_tokens=c.max_new_tokens, stop_tokens=(STOP_ID,),
        max_prompt_len=c.max_prompt_len, prompt_bucket=c.prompt_bucket,
    )  # fmt: skip
    drafter, draft_shapes, draft_cfg, head_cfg = None, None, None, None
    if mode != 'ar':
        drafter, draft_shapes, draft_cfg, head_cfg = _drafter(s, target)
    tree = tree_shape(s.tree) if mode == 'tree' else None
    lossy = mode != 'ar'
    engine = Engine(
        target, decode, drafter, s.num_draft if mode == 'chain' else 0,
        rules.make(s.rule) if lossy else rules.Lossless(), bool(s.baseline) and lossy,
        sampler_from_config(c.sampling), bool(s.meter_distortion), tree,
    )  # fmt: skip
    bucket = batching.prompt_bucket_of(
        prompt_len or c.max_prompt_len, c.prompt_bucket, c.max_prompt_len
    )
    engine.check(bucket)
    data, model = mesh_shape
    batch = -(-int(c.batch_size) // data) * data  # Padded as `decoding.generate` pads.
    width = {'ar': 1, 'chain': engine.num_draft + 1, 'tree': tree.nodes if tree else 1}[mode]
    calls = _draft_calls(s.drafter, mode, engine.num_draft, tree) if mode != 'ar' else ()
    plan = Plan(target, batch, bucket, engine.slots(bucket), width, (data, model), quant,
                draft_cfg, head_cfg, s.get('draft_sharding', 'batch'), calls)  # fmt: skip
    return engine, plan, draft_shapes


def _draft_calls(drafter: str, mode: str, num_draft: int, tree) -> tuple[int, ...]:
    """Tokens a row of each call of the draft model in a round (`Plan.draft_calls`): a
    draft LM's 2-token window and A - 1 steps (drafters/lm.py); an EAGLE-3 head's window
    over the tokens the target processed (chain) or the accepted path (tree), then A - 1
    steps (chain) or one call on each drafted level's frontier (drafters/eagle3.py)."""
    if drafter == 'ngram':
        return ()
    if mode == 'chain':
        return (2 if drafter == 'lm' else num_draft + 1,) + (1,) * (num_draft - 1)
    levels = ([len(level) for level in tree.levels] if tree.static
              else [tree.branch] * (tree.levels_drafted - 1))  # fmt: skip
    return (tree.path_len + 1, *levels)


def build_abstract(
    c: ml_collections.ConfigDict, mode: str, mesh: Mesh, quant: str = '', prompt_len: int = 0
) -> Abstract:
    """`plan_of` on `mesh`, every array placed (module docstring).

    Raises:
      ValueError: as `plan_of`, and a mesh axis that does not divide a sharded parameter
        (`sharding.check_divides`).
    """
    shape = (int(mesh.shape['data']), int(mesh.shape['model']))
    engine, plan, draft_shapes = plan_of(c, mode, shape, quant, prompt_len)
    target_params = place(param_shapes(plan.target), mesh)
    draft_params = place(draft_shapes, mesh, getattr(engine.drafter, 'rules', sharding.DRAFT_RULES))
    b, bp = (NamedSharding(mesh, sharding.RULES.spec(x, mesh)) for x in ('b', 'b.'))
    rows = (
        jax.ShapeDtypeStruct((plan.batch, plan.prompt_len), jnp.int32, sharding=bp),
        *(jax.ShapeDtypeStruct((plan.batch,), jnp.int32, sharding=b) for _ in range(3)),
        jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P())),
    )
    return Abstract(engine, (target_params, draft_params, *rows), plan, mesh)


def _drafter(s, target: ModelConfig):
    """(drafter, its params in shapes, draft LM config or None, head config or None)."""
    v = target.vocab_size
    split = sharding.draft_rules(s.get('draft_sharding', 'batch'))
    if s.drafter == 'ngram':
        return drafters.NgramDrafter(s.ngram, v), None, None, None
    if s.drafter == 'lm':
        dcfg = model_config(s.draft, target.dtype)
        base: Any = drafters.LMDrafter(dcfg, v, split)
        shapes, head = param_shapes(dcfg), None
    elif s.drafter == 'eagle3':
        head = head_config(s.draft, target)
        base, dcfg = drafters.Eagle3Drafter(head, split), None
        weights = memory.head_shapes(head)
        shapes = dict(  # `Eagle3Drafter.params_for`: the head, the target's embedding, ids.
            head=jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, target.dtype), weights),
            embed_vd=jax.ShapeDtypeStruct((v, target.width), target.dtype),
            draft_ids_u=jax.ShapeDtypeStruct((head.draft_vocab_size,), jnp.int32),
        )
    else:
        raise ValueError(f"drafter {s.drafter!r} is not one of ('lm', 'eagle3', 'ngram')")
    drafter = drafters.PromptLookup(base, s.ngram, s.lookup) if s.lookup else base
    drafter.check(target)
    return drafter, shapes, dcfg, head


def place(shapes, mesh: Mesh, rules_: sharding.ShardingRules = sharding.RULES):
    """ShapeDtypeStructs of `shapes` (None: None) with the NamedShardings `rules_` give them
    on `mesh` (divisibility checked: `sharding.checked_specs`)."""
    if shapes is None:
        return None
    specs = sharding.checked_specs(shapes, mesh, rules_)
    return jax.tree.map(
        lambda x, spec: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec)),
        shapes,
        specs,
    )


def _json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
