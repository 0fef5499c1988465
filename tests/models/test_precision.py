"""Matmul precision in the engine's exactness paths: every dot of an fp32 decode loop (AR,
chain with a draft LM, EAGLE-3 tree) asks for 'highest' in the lowered program (a GPU's
default for fp32 is reduced: spec_jax.models.precision); a bf16 loop keeps the default."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest

from spec_jax import decoding
from spec_jax.decoding import batching, engine, trees
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.models import eagle3 as e3
from spec_jax.models import precision
from spec_jax.testing import tiny

pytestmark = pytest.mark.gpu
BF16 = dataclasses.replace(tiny.TARGET, dtype='bfloat16')


def _dot_precisions(run: decoding.Engine, params, draft_params) -> list[str]:
    """The precision attribute of every dot_general in the lowered (not compiled) loop."""
    batch = batching.pack_prompts(tiny.PROMPTS, prompt_bucket=8, max_prompt_len=64)
    b = len(tiny.PROMPTS)
    args = (jnp.asarray(batch.tokens), jnp.asarray(batch.lengths), jnp.full((b,), 20, jnp.int32),
            jnp.arange(b, dtype=jnp.int32), jax.random.PRNGKey(0))  # fmt: skip
    text = engine.decode_loop.lower(run, params, draft_params, *args).as_text()
    dots = [line for line in text.splitlines() if 'stablehlo.dot_general' in line]
    assert dots, 'no dot in the lowered loop'
    return [(re.findall(r'precision = \[(\w+), \w+\]', d) or ['(none)'])[0] for d in dots]


@pytest.fixture(scope='module')
def target():
    return tiny.target_params()


def test_fp32_loops_run_every_dot_at_highest(target):
    runs = {
        'ar': (decoding.Engine(tiny.TARGET, tiny.DECODE), None),
        'chain': (decoding.Engine(tiny.TARGET, tiny.DECODE, LMDrafter(tiny.DRAFT), 3),
                  tiny.draft_params()),
        'tree': (decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(tiny.HEAD),
                                 tree=trees.TreeShape(8, 4, 2)), tiny.head(target)),
    }  # fmt: skip
    for mode, (run, draft) in runs.items():
        found = _dot_precisions(run, target, draft)
        assert set(found) == {'HIGHEST'}, (mode, sorted(set(found)))


def test_bf16_loop_keeps_the_default(target):
    """bf16 (what accelerators serve) leaves the choice to the platform: no dot of the
    target's or the head's asks for more."""
    head_cfg = e3.Eagle3Config.for_target(BF16, tiny.U, taps=tiny.HEAD.taps)
    run = decoding.Engine(BF16, tiny.DECODE, Eagle3Drafter(head_cfg), tree=trees.TreeShape(8, 4, 2))
    found = _dot_precisions(run, target, tiny.head(target))
    assert 'HIGHEST' not in found, sorted(set(found))


def test_precision_and_tolerance_by_dtype():
    assert precision.matmul_precision('float32') == jax.lax.Precision.HIGHEST
    assert precision.matmul_precision(jnp.bfloat16) is None
    assert precision.law_atol(jnp.float32) < precision.law_atol('bfloat16')
    with pytest.raises(ValueError, match="no tolerance for dtype 'float16'"):
        precision.law_atol('float16')
