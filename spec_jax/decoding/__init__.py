"""On-device decoding: one engine for AR, chain and tree rounds.

    from spec_jax import decoding
    built = decoding.build(config)               # target, drafter, rule, sampler
    result = decoding.generate(built.engine, built.params, prompt_ids)
    result.tokens, result.stats                  # per-row ids; acceptance, block efficiency
    decoding.chat(built.engine, built.params, built.tokenizer, ['Why is the sky blue?'])

    engine = decoding.Engine(cfg, decode, drafters.LMDrafter(draft_cfg), num_draft=3,
                             rule=rules.make('lenience', l=0.5))
    engine.replace(rule=rules.make('lenience', l=0.7))   # same compiled loop
    decoding.Engine(cfg, decode, drafters.Eagle3Drafter(head_cfg),
                    tree=decoding.TreeShape(nodes=8, depth=4, branch=2))  # EAGLE-3 trees

Modules: engine (the loop and its rounds), tree_rounds (a tree round), verification (the
rule or its matched baseline), trees (tree shapes, selection, ancestor masks), tree_budget
(a tree sized for the chip and the batch), adaptive (draft lengths and trees chosen
online; adaptive_trees: a tree tier's tokens; adaptive_prior: the acceptance assumed per
depth before a round is seen), state (settings, the carry, commit), stats (counters and
summaries), host (generate, chat), build (config blocks -> engine), drafters/ (the Drafter
protocol and proposers), batching, code_room. docs/engine.md describes the design.
"""

from spec_jax.decoding import drafters
from spec_jax.decoding.build import (
    Built,
    adaptive_config,
    build,
    sampler_from_config,
    sampling_config,
    spec_config,
    tree_config,
    tree_shape,
)
from spec_jax.decoding.engine import MODES, Engine, decode_loop
from spec_jax.decoding.host import Params, Result, chat, encode, generate
from spec_jax.decoding.state import DecodeSettings, DecodeState
from spec_jax.decoding.stats import Stats, summarize
from spec_jax.decoding.trees import TreeShape
from spec_jax.decoding.verification import Verification

__all__ = [
    'MODES',
    'Built',
    'DecodeSettings',
    'DecodeState',
    'Engine',
    'Params',
    'Result',
    'Stats',
    'TreeShape',
    'Verification',
    'adaptive_config',
    'build',
    'chat',
    'decode_loop',
    'drafters',
    'encode',
    'generate',
    'sampler_from_config',
    'sampling_config',
    'spec_config',
    'summarize',
    'tree_config',
    'tree_shape',
]
