"""The logit rules against their upstream references (docs/laws.md §7.1-§7.3): fuzzy SD's
`js` as the reference code's `js_div`, MARS's ratio at a zero top logit in IEEE arithmetic,
and relaxed acceptance's reasoning span beside TensorRT-LLM's prompt phase."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax.rules import logit_rules

from .test_logit_rules import A, divergence, fixture, raw_of, relaxed_law, round_law


def trtllm_prompt_delta(prompt, delta, think):
    """TensorRT-LLM's context phase (tensorrt_llm/_torch/speculative/mtp.py @23ee85ee,
    `sample_and_accept_draft_tokens`): the request's delta is `relaxed_delta` when the prompt
    holds at least one `<think>` (`ctx_think_tokens_num >= 1`), whatever follows it."""
    return delta if int(np.sum(np.asarray(prompt) == think)) >= 1 else 0.0


def test_relaxed_span_on_a_prompt_holding_a_closed_think():
    """A prompt holding a closed `<think> ... </think>`: ours reads the history and stays at
    delta 0 (the last `<think>` is closed), where TensorRT-LLM's prompt phase relaxes (the
    prompt holds a `<think>`) until a generated `</think>`: the documented difference
    (docs/laws.md §7.1), here with laws that differ."""
    z, p, zd, q = fixture(7)
    rule = rules.make('relaxed', top_k=5, delta=1.0, span_open=3, span_close=4)
    prompt = [9, 3, 8, 4, 8]
    raw = rules.Raw(jnp.asarray(z[None]), jnp.asarray(zd[None]), jnp.asarray([prompt]),
                    jnp.asarray([len(prompt)]))  # fmt: skip
    law = np.asarray(round_law(rule, jnp.asarray(p[None]), jnp.asarray(q[None]),
                               jnp.zeros((1, A), jnp.int32), raw))[0, 0]  # fmt: skip
    np.testing.assert_allclose(law, relaxed_law(z[0], q[0], 5, 0.0), atol=2e-6)
    theirs = relaxed_law(z[0], q[0], 5, trtllm_prompt_delta(prompt, 1.0, think=3))
    assert 0.5 * np.abs(theirs - law).sum() > 0.05  # The difference matters on these laws.


def test_fuzzy_js_is_the_reference_js_div():
    """'js' against the reference's formula in numpy (torch's kl_div order: 0.5 KL(m || p1) +
    0.5 KL(m || q1)) on the issue's vectors and two more; 'js_textbook' is the
    Jensen-Shannon divergence. On the issue's pair the reference rejects at 0.4 (0.492) where
    the textbook JS accepts (0.356)."""
    rng = np.random.default_rng(3)
    pairs = [
        ([0.88, 0.1] + [0.005] * 4, [0.1, 0.88] + [0.005] * 4),
        ([0.4, 0.3, 0.2, 0.1], [0.7, 0.3, 0.0, 0.0]),  # A draft law with zeros: infinite.
        tuple(rng.dirichlet(np.ones(7), 2)),
    ]
    for p1, q1 in pairs:
        with np.errstate(divide='ignore'):  # log 0 = -inf: a draft logit masked out.
            zt, zd = (np.log(np.asarray(x, np.float64)) for x in (p1, q1))
            want_js, want_text = divergence('js', zt, zd), divergence('js_textbook', zt, zd)
        got_js, got_text = (float(logit_rules.divergence(k, jnp.asarray(zt, jnp.float32),
                                                           jnp.asarray(zd, jnp.float32)))
                            for k in ('js', 'js_textbook'))  # fmt: skip
        if math.isinf(want_js):
            assert math.isinf(got_js), got_js
        else:
            assert got_js == pytest.approx(want_js, abs=1e-6), (p1, got_js, want_js)
        assert got_text == pytest.approx(want_text, abs=1e-6) and got_text <= math.log(2) + 1e-6
    zt, zd = (np.log(np.asarray(x)) for x in pairs[0])
    assert divergence('js', zt, zd) == pytest.approx(0.4918, abs=1e-4)
    assert divergence('js_textbook', zt, zd) == pytest.approx(0.3563, abs=1e-4)
    raw = raw_of(zt[None, None], zd[None, None])
    assert not bool(rules.make('fuzzy', threshold=0.4).accepts(raw, 1)[0, 0])
    assert bool(rules.make('fuzzy', threshold=0.4, divergence='js_textbook').accepts(raw, 1)[0, 0])


def test_mars_gate_at_a_zero_top_logit_is_ieee():
    """r = z_2 / z_1 in IEEE arithmetic: z_1 = 0 gives -inf (z_2 < 0) or NaN (z_2 = 0), and the
    gate is closed for every theta; a negative z_1 gives r >= 1 (open below theta 1)."""
    z = jnp.asarray([[0.0, -1.0, -3.0, -2.0], [0.0, 0.0, -1.0, -2.0], [-1.0, -2.0, -3.0, -4.0],
                     [4.0, 3.8, 1.0, 0.0]])  # fmt: skip
    gate, _ = logit_rules.mars_gate(z, 0.0)
    assert np.asarray(gate).tolist() == [False, False, True, True]
    assert not np.asarray(logit_rules.mars_gate(z, -math.inf)[0])[:2].any()
