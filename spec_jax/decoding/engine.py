"""The decoding engine: one on-device loop whose rounds are AR steps or chain blocks.

A round, for every row at once (docs/engine.md):
  1. propose: the drafter proposes x_1..x_A with the processed q it sampled them from
     (A = 0 in AR mode: nothing is drafted);
  2. target forward: [s_C, x_1..x_A] in one call (T = A + 1) at positions C..C+A;
  3. verify: `rules.verify_chain` accepts n drafts and draws the replacement or bonus token
     (with A = 0 that is one draw from the rule's bonus law: an AR step);
  4. commit: the n + 1 tokens are appended, cut at a stop token or the row's limit, and C
     advances (`DecodeState.commit`); the target cache already holds their keys/values;
  5. observe: the drafter reads the round (an EAGLE-3 head the taps of the verified
     positions).
A tree round (`tree_round`, decoding/tree_rounds.py) is the same round over a draft tree:
the drafter proposes M nodes, the target reads them in one forward through the tree's
ancestor mask, `rules.verify_tree` walks the accepted path, `KVCache.commit_path` moves it
into place, and the drafter observes the path's taps.

`Engine` is a pytree: the rule's float parameters, the baseline flag and the sampler are
leaves (traced), everything else is static. A sweep over one rule's parameter, and its
matched baseline, runs through one compiled loop.

Probabilities: p = transform(sampler.probs(target logits)), q likewise for the draft, where
`transform` is the matched baseline's truncation when `baseline` holds (applied to target
and draft in chain mode, docs/engine.md) and the identity otherwise, so a lossy rule's gate
reads the temperature-processed target.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from spec_jax import categorical, rules, sharding
from spec_jax.decoding import adaptive as adaptive_lib
from spec_jax.decoding import trees
from spec_jax.decoding.drafters import Drafter, NoDrafter
from spec_jax.decoding.state import (
    DecodeSettings,
    DecodeState,
    check_context,
    is_stop,
    prefill,
    uncut_draft,
)
from spec_jax.decoding.stats import Stats
from spec_jax.decoding.tree_rounds import path_result, tree_round  # noqa: F401 (engine's API)
from spec_jax.decoding.verification import Verification, raw_inputs
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward
from spec_jax.sampling import Sampler

MODES = ('ar', 'chain', 'tree')
_LOSSLESS = rules.Lossless()


@dataclasses.dataclass(frozen=True)
class Engine:
    """What to decode with: the target's config, the drafter, the rule and the sampler.

    A pytree: `rule` (its float parameters), `baseline` and `sampler` are leaves, so new
    values reuse the compiled loop; the rest is static (a new value compiles anew).

    Attributes:
      cfg: the target's model config.
      decode: buffers, buckets and stop tokens.
      drafter: the proposer (`NoDrafter` for AR, the default).
      num_draft: A (gamma), drafted tokens per chain round; 0 = AR. In tree mode the
        longest path a round can accept (set from `tree`; the per-depth statistics' width).
      rule: the verification rule (`rules.make`); AR mode samples its bonus law.
      baseline: run the rule's matched baseline instead (truncation + lossless).
      sampler: applied to target and draft logits alike (default greedy).
      tree: a draft tree (`trees.TreeShape`): tree rounds (the drafter must build trees:
        `propose_tree`, the EAGLE-3 head) instead of chain rounds.
      meter_distortion: also meter, at every emitted position (drafts, replacement and
        bonus tokens, the first token), the emitted law's distortion from the matched
        baseline's law (`rules.Metered`: TV, KL, JS, outside mass, overshoot).
      adaptive: each chain round's draft length chosen on device from the run's acceptance
        and the tiers' costs (`adaptive.Adaptive`; its costs and prior are leaves); the
        drafter then runs `deferred()` (a draft LM's prefill waits for its first proposal).
    """

    cfg: ModelConfig
    decode: DecodeSettings = DecodeSettings()
    drafter: Drafter | None = None
    num_draft: int = 0
    rule: rules.Rule = _LOSSLESS
    baseline: bool = False
    sampler: Sampler = Sampler(temperature=0.0)
    meter_distortion: bool = False
    tree: trees.TreeShape | None = None
    adaptive: adaptive_lib.Adaptive | None = None

    def __post_init__(self):
        if self.drafter is None:
            object.__setattr__(self, 'drafter', NoDrafter(self.cfg.vocab_size))
        if self.adaptive is not None:
            if self.tree is not None and not self.adaptive.trees:  # Tiers: AR and the tree.
                adaptive = dataclasses.replace(self.adaptive, trees=(self.tree,))
                object.__setattr__(self, 'adaptive', adaptive)
            num = self.num_draft if self.tree is None else self.tree.path_len
            self.adaptive.check(num, self.drafter, self.tree)
            # A draft LM's prefill waits for its first drafting round (the choice prices it).
            object.__setattr__(self, 'drafter', self.drafter.deferred())
        if self.tree is not None:  # num_draft follows the tree (so `replace` may change it).
            object.__setattr__(self, 'num_draft', self.tree.path_len)
            return
        if self.num_draft < 0:
            raise ValueError(f'num_draft (gamma) must be >= 0 (0 = AR), got {self.num_draft}')
        if (self.num_draft == 0) != isinstance(self.drafter, NoDrafter):
            raise ValueError(
                f'num_draft={self.num_draft} with drafter {type(self.drafter).__name__}: AR '
                'decoding (num_draft=0) has no drafter, and a drafter needs num_draft >= 1'
            )

    @property
    def mode(self) -> str:
        if self.tree is not None:
            return 'tree'
        return 'ar' if self.num_draft == 0 else 'chain'

    def replace(self, **changes) -> Engine:
        return dataclasses.replace(self, **changes)

    def slots(self, prompt_bucket: int) -> int:
        """Cache positions a run needs: prompt bucket + output buffer + a verification's
        room past the last kept token."""
        if self.tree is not None:
            extra = self.tree.room
        else:
            extra = self.num_draft + 1 if self.num_draft else 0
        return prompt_bucket + self.decode.buffer_len + extra

    def check(self, prompt_bucket: int | None = None) -> None:
        """Clear errors, before anything compiles, for a drafter that does not fit the
        target or a run longer than the models' contexts."""
        slots = None if prompt_bucket is None else self.slots(prompt_bucket)
        self.drafter.check(self.cfg, slots)
        if self.tree is not None:
            self._check_tree()
        if slots is None:
            return
        if self.tree is not None:
            parts = 'prompt bucket + new tokens + tree room (max(nodes, head scratch, depth + 1))'
            knobs = 'max_prompt_len, max_new_tokens or the tree shape'
        elif self.num_draft:
            parts = 'prompt bucket + new tokens + num_draft + 1'
            knobs = 'max_prompt_len, max_new_tokens or num_draft'
        else:
            parts, knobs = 'prompt bucket + new tokens', 'max_prompt_len or max_new_tokens'
        check_context(self.cfg, slots, parts, 'the target', knobs)

    def _check_tree(self) -> None:
        if not callable(getattr(self.drafter, 'propose_tree', None)):
            raise ValueError(
                f'tree mode needs a drafter that builds trees (the EAGLE-3 head: drafter '
                f"'eagle3', lookup 0); {type(self.drafter).__name__} drafts chains only"
            )
        mode = self.tree.mode
        if mode not in self.rule.tree_modes:
            with_trees = [n for n in rules.names() if mode in rules.make(n).tree_modes]
            what = f'{mode}-sibling' if self.tree.sampled else 'tree'
            raise ValueError(
                f'rule {self.rule.name!r} has no {what} form; the rules with one: {with_trees}'
            )

    def tree_flatten(self):
        static = (
            self.cfg, self.decode, self.drafter, self.num_draft, self.meter_distortion, self.tree
        )  # fmt: skip
        return (self.rule, self.baseline, self.sampler, self.adaptive), static

    @classmethod
    def tree_unflatten(cls, static, children):
        engine = object.__new__(cls)  # No validation: leaves may be tracers.
        names = ('cfg', 'decode', 'drafter', 'num_draft', 'meter_distortion', 'tree')
        for name, value in zip(names, static):
            object.__setattr__(engine, name, value)
        for name, value in zip(('rule', 'baseline', 'sampler', 'adaptive'), children):
            object.__setattr__(engine, name, value)
        return engine


jax.tree_util.register_pytree_node(Engine, Engine.tree_flatten, Engine.tree_unflatten)


def probs_fn(engine: Engine, verification: Verification):
    """logits [..., V] -> processed probabilities: the sampler, then the baseline's
    truncation when `baseline` holds."""
    return lambda logits: verification.transform(engine.sampler.probs(logits))


def target_probs(engine: Engine, verification: Verification, logits: jax.Array):
    """The target's (sampler-processed p, what verification reads: p or its truncation)."""
    p = engine.sampler.probs(logits)
    return p, verification.transform_target(p, logits)


def init_state(
    engine: Engine,
    params: dict,
    draft_params,
    prompt_bp: jax.Array,
    prompt_len_b: jax.Array,
    limit_b: jax.Array,
    sample_id_b: jax.Array,
    seed_key: jax.Array,
) -> DecodeState:
    """Prefill, the first token (a draw from the rule's bonus law) and the drafter's init."""
    cfg, dec, drafter = engine.cfg, engine.decode, engine.drafter
    verification = Verification(engine.rule, engine.baseline)
    batch, bucket = prompt_bp.shape
    slots = engine.slots(bucket)
    cache = KVCache.init(cfg, batch, slots)
    taps = drafter.tap_layers
    logits_bv, taps_bped, cache = prefill(cfg, params, cache, prompt_bp, prompt_len_b, taps)
    key_b = jax.vmap(jax.random.fold_in, (None, 0))(seed_key, sample_id_b)
    keys_b2 = jax.vmap(jax.random.split)(key_b)
    raw_p, first_p = target_probs(engine, verification, logits_bv)
    first_law = verification.bonus(first_p)
    first_b = categorical.sample_rows(keys_b2[:, 1], first_law)
    stats = Stats.zeros(batch, engine.num_draft, dec.buffer_len)
    if engine.meter_distortion:  # The first token is drawn from the bonus law.
        metered = verification.meter(first_law, raw_p, logits_bv)
        stats = stats.meter(metered, jnp.ones((batch,), bool))
    history_bs = jnp.zeros((batch, slots), jnp.int32).at[:, :bucket].set(prompt_bp)
    history_bs = history_bs.at[jnp.arange(batch), prompt_len_b].set(first_b)
    ranks = None  # An adaptive tree's counts per depth and rank (adaptive_trees.rank_counts).
    if engine.adaptive is not None and engine.tree is not None:
        ranks = jnp.zeros((2, engine.num_draft, engine.adaptive.width), jnp.float32)
    return DecodeState(
        ranks=ranks,
        cache=cache,
        draft=drafter.init(draft_params, history_bs, prompt_len_b, bucket, taps_bped),
        history_bs=history_bs,
        committed_b=prompt_len_b,
        prompt_len_b=prompt_len_b,
        limit_b=limit_b,
        done_b=is_stop(first_b, dec.stop_tokens) | (limit_b <= 1),
        key_b=keys_b2[:, 0],
        stats=stats,
    )


@jax.jit
def decode_loop(
    engine: Engine,
    params: dict,
    draft_params,
    prompt_bp: jax.Array,
    prompt_len_b: jax.Array,
    limit_b: jax.Array,
    sample_id_b: jax.Array,
    seed_key: jax.Array,
) -> tuple[jax.Array, jax.Array, Stats]:
    """The on-device loop: prompts [B, P] -> (tokens [B, N], lengths [B], stats).

    Row b's noise comes from `fold_in(seed_key, sample_id_b[b])` only, so a prompt gets the
    same tokens whatever batch, row or process it runs in. `decoding.generate` runs the
    same as two calls, `prefill_call` then `rounds_call`, to time the prefill apart.
    """
    state = init_state(
        engine, params, draft_params, prompt_bp, prompt_len_b, limit_b, sample_id_b, seed_key
    )
    return rounds(engine, params, draft_params, state)[:3]


# `init_state` alone: the prefill call of `decoding.generate`.
prefill_call = jax.jit(init_state)


@partial(jax.jit, donate_argnums=3)
def rounds_call(engine: Engine, params: dict, draft_params, state: DecodeState):
    """`rounds` jitted: the rounds of `decode_loop` on the state `prefill_call` returned,
    donated, and returned at the end, so the loop updates its cache in place."""
    return rounds(engine, params, draft_params, state)


def rounds(
    engine: Engine, params: dict, draft_params, state: DecodeState
) -> tuple[jax.Array, jax.Array, Stats, DecodeState]:
    """The `lax.while_loop` of rounds until every row is done, from the state after
    prefill: (tokens [B, N], lengths [B], stats, the final state)."""
    drafter, a = engine.drafter, engine.num_draft
    chain = partial(chain_round, engine, params, draft_params)

    def width(s: DecodeState) -> jax.Array:
        # A drafter that knows how many of its drafts are real (prompt lookup: the matched
        # continuation) gets a verification as wide as the longest of the live rows': a
        # narrower forward costs less (on 2 CPU cores T = 2 costs 1.45x a one-token step,
        # T = 8 2.31x), and a round with nothing to verify is a plain AR step.
        n_b = jnp.where(s.done_b, 0, drafter.draft_len(s.history_bs, s.committed_b, a))
        return jnp.max(n_b)

    tree = partial(tree_round, engine, params, draft_params)
    if engine.adaptive is not None:  # Each round's size chosen on device (adaptive.py).
        tiers = [partial(chain, a_round=k, follow=True) for k in engine.adaptive.tiers]
        if engine.tree is not None:  # Tree mode: AR or one of the tier trees.
            tiers = [tiers[0], *(partial(tree, shape=t) for t in engine.adaptive.trees)]
        body = switch_rounds(lambda s: engine.adaptive.tier(s, drafter.lag(s.draft, s.committed_b)),
                             tiers)  # fmt: skip
    elif engine.tree is not None:
        body = tree
    elif drafter.narrows:
        body = switch_rounds(width, [partial(chain, a_round=k) for k in range(a + 1)])
    else:
        body = partial(chain, a_round=a)
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done_b), body, state)
    tokens_bo, num_b = state.outputs(engine.decode.buffer_len)
    return sharding.constrain(tokens_bo, 'b.'), sharding.constrain(num_b, 'b'), state.stats, state


def switch_rounds(pick, rounds):
    """A loop body that runs `rounds[pick(s)]` each round, as `lax.switch` would, as one
    `lax.while_loop` per round kind (each runs while the pick stays on it; every round is
    the one `pick` chooses on the state before it, the same sequence). The pick rides in
    the carry: evaluated once after each round and once a pass over the kinds. XLA:CPU
    copies every buffer a conditional's branch updates, each call: with `lax.switch` a
    drafting round copied every layer's keys and values of both caches; a while loop's body
    updates them in place (tests: `testing.loop_copies` reads conditionals' branches too)."""

    def step(round_fn, carry):
        s = round_fn(carry[0])
        return s, pick(s)

    def body(s: DecodeState) -> DecodeState:
        carry = (s, pick(s))
        for k, round_fn in enumerate(rounds):
            carry = jax.lax.while_loop(lambda c, k=k: ~jnp.all(c[0].done_b) & (c[1] == k),
                                       partial(step, round_fn), carry)  # fmt: skip
        return carry[0]

    return body


def chain_round(
    engine: Engine, params: dict, draft_params, s: DecodeState, a_round: int,
    follow: bool = False,
) -> DecodeState:
    """One round with `a_round` drafts (0: a plain one-token AR step, and with `follow` the
    adaptive AR tier: the drafter follows the text by `Drafter.follow`, no draft asked)."""
    cfg, drafter = engine.cfg, engine.drafter
    verification = Verification(engine.rule, engine.baseline)
    processed = probs_fn(engine, verification)
    batch = s.history_bs.shape[0]
    key_b, k_draft_b, k_verify_b = s.split_keys(3)
    live_b = ~s.done_b
    draft = s.draft
    if a_round:
        draft, x_ba, q_bav = drafter.propose(
            draft_params, draft, s.history_bs, s.committed_b, k_draft_b, a_round, processed
        )
    else:
        x_ba = jnp.zeros((batch, 0), jnp.int32)
        q_bav = jnp.zeros((batch, 0, cfg.vocab_size), jnp.float32)
    verify_bt = jnp.concatenate([s.pending_b()[:, None], x_ba], axis=1)
    logits_btv, taps_bted, cache = forward(
        cfg,
        params,
        verify_bt,
        s.cache.positions(a_round + 1),
        s.cache,
        s.cache.causal_mask(a_round + 1),
        tap_layers=drafter.tap_layers,
    )
    raw_btv, p_btv = target_probs(engine, verification, logits_btv)
    raw, extra = None, {}
    if verification.needs_logits:  # Rules that read the raw logits (docs/rules.md).
        raw = raw_inputs(engine.sampler, logits_btv, q_bav, s.history_bs, s.committed_b + 1)
        extra = {'raw': raw}
    out = rules.verify_chain(verification, k_verify_b, p_btv, q_bav, x_ba, **extra)
    metered = overlap_ba = None
    if engine.meter_distortion:
        # The law each offset emitted against the matched baseline's law of the same p.
        pi = verification.emitted_law(raw_btv, q_bav, x_ba, raw)
        metered = verification.meter(pi, raw_btv, None if raw is None else logits_btv)
        # Lossless SD's acceptance at each drafted position: the frontier's reference.
        overlap_ba = jnp.minimum(raw_btv[:, :a_round], q_bav).sum(-1)
    start_b = s.committed_b
    stops = engine.decode.stop_tokens  # The paper's full blocks: drafts no stop or limit cut.
    full_b = uncut_draft(x_ba, stops, s.limit_b - s.num_out_b, engine.num_draft)
    stats = s.stats.update(out, live_b, metered, full_b, overlap_ba)
    s = s.replace(cache=cache, key_b=key_b, stats=stats)
    s = s.commit(out.tokens, out.num_emitted, stops)
    see = drafter.follow if follow and not a_round else drafter.observe
    draft = see(draft_params, draft, s.history_bs, start_b, s.committed_b, taps_bted)
    return s.replace(draft=draft)
