"""Rules that read the raw logits: relaxed acceptance, MARS, fuzzy SD (docs/laws.md §7.1-§7.3).

Each sets `needs_logits` (the verifier passes `contract.Raw`: the target's raw logits, the draft's
T = 1 log-probabilities, the token history) and `block_level` (it decides its block in
`accept_block`; all three keep the leading run of per-position accepts, so their laws are
per position, in `round_law`). Sources, commits and where upstream and issue 32 differ:
docs/laws.md §7.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base, contract, registry

Array = jax.Array


def _softmax(logits: Array) -> Array:
    return jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)


def _scatter_mask(idx: Array, ok: Array, v: int) -> Array:
    """[..., V] bool, True at idx[..., j] where ok[..., j] (idx distinct per row)."""
    lead = idx.shape[:-1]
    rows = int(math.prod(lead)) if lead else 1
    flat_idx, flat_ok = idx.reshape(rows, -1), ok.reshape(rows, -1)
    mask = jnp.zeros((rows, v), bool).at[jnp.arange(rows)[:, None], flat_idx].set(flat_ok)
    return mask.reshape(lead + (v,))


def _no_token_form(name: str):
    raise ValueError(
        f'rule {name!r} reads the raw logits: it has no a(x) from processed p and q alone; '
        'verify it with rules.verify_chain(..., raw=rules.Raw(...)) and read its law from '
        'round_law(p, q, x, raw)'
    )


def _check_int(rule: str, name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f'{rule}: {name}={value!r} must be an integer >= {lo}')
    return value


@registry.register
@dataclasses.dataclass(frozen=True)
class Relaxed(base.Rule):
    """Relaxed acceptance (TensorRT-LLM MTP `relaxed_topk`/`relaxed_delta`; Modular MAX),
    docs/laws.md §7.1.

    On the untempered target p~ = softmax(raw logits) at each drafted position, the allowed
    set is A = {the top-`top_k` tokens of p~ (ties by lower id, as `lax.top_k`) whose p~ is
    >= p~_1 - delta}, the top-1 always included (TensorRT-LLM's kernel scans the top K and
    stops at the first candidate below p~_1 - delta).

    - a(x) = 1[x in A] (deterministic), scanning to the first failure.
    - Replacement: the top-1 token (onehot(argmax)).
    - Bonus: the top-1 (`bonus_mode='argmax'`, TensorRT-LLM) or a sample of the processed
      target p (`'sample'`, MAX samples its bonus from the tempered target).
    - Law at a drafted position: pi = q 1_A + (1 - q(A)) onehot(argmax p~). At top_k = 1
      (any delta) A = {argmax}: greedy verification, pi = onehot(argmax).
    - Span: with `span_open`/`span_close` token ids (`<think>`/`</think>`) set, delta applies
      only to rows whose history has an open span at the round's start (TensorRT-LLM sets the
      request's delta when it accepts `<think>` and zeroes it at `</think>`); elsewhere delta
      is 0 (the top-1 and its exact ties). Unlike TensorRT-LLM's prompt phase, which relaxes
      whenever the prompt holds any `<think>`, a prompt whose `<think>` is closed is not
      relaxed here (docs/laws.md §7.1). Default -1: no span, relaxed everywhere (the
      embedded default model has no reasoning span).
    - Presets: 'max' (K 10, delta 0.6: MAX's `SpeculativeConfig` defaults; bonus sampled),
      'trtllm' (K 10, delta 0.6 with TensorRT-LLM's top-1 bonus); TensorRT-LLM's own config
      defaults (K 1, delta 0) are the greedy setting.
    """

    delta: float = 0.6
    top_k: int = 10
    bonus_mode: str = 'argmax'
    span_open: int = -1
    span_close: int = -1

    name = 'relaxed'
    static_fields = ('top_k', 'bonus_mode', 'span_open', 'span_close')
    needs_logits = True
    block_level = True
    section = '§7.1'
    presets = {
        'max': {'top_k': 10, 'delta': 0.6, 'bonus_mode': 'sample'},
        'trtllm': {'top_k': 10, 'delta': 0.6, 'bonus_mode': 'argmax'},
    }

    def __post_init__(self):
        base.set_field(
            self,
            'delta',
            base.check_range('relaxed', 'delta', self.delta, 0.0, 1.0, lo_open=False,
                             hi_open=False),  # fmt: skip
        )
        _check_int('relaxed', 'top_k', self.top_k, 1)
        if self.bonus_mode not in ('argmax', 'sample'):
            raise ValueError(
                f"relaxed: bonus_mode={self.bonus_mode!r} must be 'argmax' or 'sample'"
            )
        _check_int('relaxed', 'span_open', self.span_open, -1)
        _check_int('relaxed', 'span_close', self.span_close, -1)
        if (self.span_open < 0) != (self.span_close < 0):
            raise ValueError(
                f'relaxed: span_open={self.span_open} and span_close={self.span_close}: give both '
                'token ids (the span is relaxed) or neither (-1: relaxed everywhere)'
            )

    @property
    def lossless(self) -> bool:
        """Greedy-exact at top_k = 1 with the top-1 bonus."""
        return self.top_k == 1 and self.bonus_mode == 'argmax'

    def row_delta(self, raw: contract.Raw | None, b: int) -> Array:
        """delta per row [B]: delta where the row is inside the span (everywhere without one),
        0 elsewhere."""
        delta = jnp.broadcast_to(jnp.asarray(self.delta, jnp.float32), (b,))
        if self.span_open < 0:
            return delta
        if raw is None or raw.context is None:
            raise ValueError('relaxed: a span rule needs the token history (Raw.context)')
        pos = jnp.arange(raw.context.shape[1])[None, :]
        valid = pos < raw.context_len[:, None]
        last_open = jnp.max(jnp.where(valid & (raw.context == self.span_open), pos, -1), 1)
        last_close = jnp.max(jnp.where(valid & (raw.context == self.span_close), pos, -1), 1)
        return jnp.where(last_open > last_close, delta, 0.0)

    def candidates(self, logits: Array, delta: Array) -> tuple[Array, Array]:
        """(ids [..., K], ok [..., K]): the top-K ids of softmax(logits) and which pass the
        delta test; delta broadcasts against the leading axes."""
        pt = _softmax(logits)
        k = min(self.top_k, pt.shape[-1])
        vals, idx = categorical.top_k(pt, k)
        ok = (jnp.arange(k) == 0) | (vals >= vals[..., :1] - delta[..., None])
        return idx, ok

    def allowed_from_logits(self, logits: Array, delta: Array | None = None) -> Array:
        """The allowed set A [..., V] bool of raw logits [..., V] (delta: the rule's)."""
        if delta is None:
            delta = jnp.broadcast_to(jnp.asarray(self.delta, jnp.float32), logits.shape[:-1])
        idx, ok = self.candidates(logits, delta)
        return _scatter_mask(idx, ok, logits.shape[-1])

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        delta = self.row_delta(raw, x.shape[0])[:, None]  # [B, 1]
        z = raw.target_logits
        idx, ok = self.candidates(z[:, :a], jnp.broadcast_to(delta, x.shape))
        acc = jnp.any((idx == x[..., None]) & ok, -1)  # [B, A]
        n = contract.leading_run(acc & (u <= 1.0))
        top = jnp.argmax(z, -1)  # [B, A+1]
        v = p.shape[-1]
        repl = jax.nn.one_hot(contract.row_at(top, n), v, dtype=p.dtype)
        bonus = self.bonus(p[:, a]) if self.bonus_mode == 'sample' else jax.nn.one_hot(
            top[:, a], v, dtype=p.dtype)  # fmt: skip
        return contract.block_from(n, a, repl, bonus, acc)

    def round_law(self, p, q, x, raw):
        a = q.shape[1]
        pi = self.bonus(p[:, -1:])
        if a:
            delta = jnp.broadcast_to(self.row_delta(raw, q.shape[0])[:, None], q.shape[:2])
            z = raw.target_logits[:, :a]
            mask = self.allowed_from_logits(z, delta)
            qa = jnp.where(mask, q, 0.0)
            top = jax.nn.one_hot(jnp.argmax(z, -1), q.shape[-1], dtype=q.dtype)
            pi = jnp.concatenate([qa + (1.0 - qa.sum(-1, keepdims=True)) * top, pi], axis=1)
        return pi

    def replacement(self, p, q):
        return base.onehot_argmax(p)

    def bonus(self, p):
        return p if self.bonus_mode == 'sample' else base.onehot_argmax(p)

    def accept_from(self, px, qx, x, stats):
        _no_token_form(self.name)

    def induced(self, p, q):
        _no_token_form(self.name)


def mars_gate(logits: Array, theta) -> tuple[Array, Array]:
    """(gate [...], top2 ids [..., 2]) of raw logits [..., V]: r = z_2 / z_1 > theta.

    IEEE division, as the paper's ratio computes it: with z_1 < 0 the ratio is >= 1 and the
    gate is open for any theta < 1; at z_1 = 0 it is -inf (z_2 < 0) or NaN (z_2 = 0), and
    both close the gate (docs/laws.md §7.2)."""
    vals, idx = categorical.top_two(jnp.asarray(logits, jnp.float32))
    r = vals[..., 1] / vals[..., 0]
    return r > theta, idx


@registry.register
@dataclasses.dataclass(frozen=True)
class Mars(base.Rule):
    """MARS, margin-aware verification (arXiv 2601.15498), chain form, docs/laws.md §7.2.

    r = z_2 / z_1, the ratio of the target's two largest logits (the temperature cancels in
    the ratio of processed logits z/T, so the raw logits are read); the gate is r > theta.

    - a(x) = 1[x in top2(p)] when the gate is open, else min(1, p(x)/q(x)) (the standard
      test); scanning to the first failure.
    - Replacement: a sample of p when the gate is open (issue 32: "all rejected: sample p"),
      else the residual norm((p - q)_+).
    - Bonus: p.
    - Law: pi = q 1_T2 + (1 - q(T2)) p where the gate is open (T2 the top-2 set), p where it
      is closed. theta = inf switches the relaxation off: lossless SD (law p).
    - Negative top logit: r >= 1 and the gate opens for every theta < 1; z_1 = 0: r = -inf
      or NaN (IEEE, as the ratio is computed) and the gate stays closed.
    - Tree (EAGLE siblings): under the gate sibling c_j is accepted iff c_j is in the top 2,
      else EAGLE's g_j = P_{j-1}(c_j); falling through the siblings; all rejected: a sample
      of p under the gate, the residual otherwise. Node law: onehot(the first sibling in the
      top 2), or p if none is, under the gate; p otherwise.
    """

    theta: float = 0.9

    name = 'mars'
    needs_logits = True
    block_level = True
    tree_modes = ('deterministic',)
    section = '§7.2'

    def __post_init__(self):
        base.set_field(
            self,
            'theta',
            base.check_range('mars', 'theta', self.theta, 0.0, math.inf, lo_open=False,
                             hi_open=False),  # fmt: skip
        )

    @property
    def lossless(self) -> bool:
        return base.host_equal(self.name, 'lossless', 'theta', self.theta, math.inf)

    def allowed_from_logits(self, logits: Array) -> Array:
        """The allowed set [..., V]: the top 2 where the gate is open, every token elsewhere."""
        gate, idx = mars_gate(logits, self.theta)
        top2 = _scatter_mask(idx, jnp.ones(idx.shape, bool), logits.shape[-1])
        return top2 | ~gate[..., None]

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        gate, idx = mars_gate(raw.target_logits, self.theta)  # [B, A+1], [B, A+1, 2]
        px, qx = base.gather(p[:, :a], x), base.gather(q, x)
        standard = jnp.where(
            qx > 0, jnp.clip(px / jnp.where(qx > 0, qx, 1.0), 0.0, 1.0), (px > 0).astype(px.dtype)
        )
        in_top2 = jnp.any(idx[:, :a] == x[..., None], -1)
        accept = jnp.where(gate[:, :a], in_top2.astype(px.dtype), standard)
        n = contract.leading_run(u <= accept)
        p_n, q_n = contract.row_at(p, n), contract.row_at(q, n)
        residual = base.normalize_or(jnp.maximum(p_n - q_n, 0.0), p_n)
        repl = jnp.where(contract.row_at(gate, n)[:, None], p_n, residual)
        return contract.block_from(n, a, repl, p[:, a], accept)

    def round_law(self, p, q, x, raw):
        a = q.shape[1]
        pi = p[:, -1:]
        if a:
            gate, idx = mars_gate(raw.target_logits[:, :a], self.theta)
            top2 = _scatter_mask(idx, jnp.ones(idx.shape, bool), q.shape[-1])
            qt = jnp.where(top2, q, 0.0)
            relaxed = qt + (1.0 - qt.sum(-1, keepdims=True)) * p[:, :a]
            pi = jnp.concatenate([jnp.where(gate[..., None], relaxed, p[:, :a]), pi], axis=1)
        return pi

    def replacement(self, p, q):
        return base.normalize_or(jnp.maximum(p - q, 0.0), p)

    def tree_node_raw(self, logits):
        return mars_gate(logits, self.theta)

    def tree_gate_raw(self, pc, c, state, node):
        gate, idx = node
        in_top2 = jnp.any(idx == c[..., None], -1).astype(pc.dtype)
        eagle = jnp.clip(pc / jnp.maximum(state.mass, base.ZERO_MASS), 0.0, 1.0)
        return jnp.where(gate, in_top2, eagle)

    def tree_final_raw(self, residual, p, node):
        return jnp.where(node[0][..., None], p, residual)

    def induced_tree_node_raw(self, p, siblings, logits):
        gate, idx = mars_gate(logits, self.theta)
        num_c = siblings.shape[-1]
        hits = jnp.stack([
            base.sibling_valid(siblings, j) & jnp.any(idx == siblings[..., j, None], -1)
            for j in range(num_c)
        ], -1)  # fmt: skip
        first = jnp.take_along_axis(siblings, jnp.argmax(hits, -1)[..., None], -1)[..., 0]
        onehot = jax.nn.one_hot(first, p.shape[-1], dtype=p.dtype)
        relaxed = jnp.where(jnp.any(hits, -1)[..., None], onehot, p)
        return jnp.where(gate[..., None], relaxed, p)

    def tree_gate(self, pc, c, state):
        _no_token_form(self.name)

    def accept_from(self, px, qx, x, stats):
        _no_token_form(self.name)

    def induced(self, p, q):
        _no_token_form(self.name)


DIVERGENCES = ('kl', 'js', 'js_textbook', 'tv')


def divergence(kind: str, target_logits: Array, draft_logits: Array) -> Array:
    """D(p1, q1) [...] of the T = 1 softmaxes of raw logits [..., V], in nats, as the fuzzy-SD
    reference code (maxholsman/fsd `_speculative_backoff_sampling`) computes it, torch's
    kl_div(input, target) being sum target (log target - input) = KL(target || exp input):

    - 'kl': kl_div(log p1, q1) = KL(q1 || p1).
    - 'js': its `js_div`, 0.5 kl_div(log p1, m) + 0.5 kl_div(log q1, m) with m = (p1 + q1)/2,
      i.e. 0.5 KL(m || p1) + 0.5 KL(m || q1): not the Jensen-Shannon divergence (the KLs
      run from m), unbounded, infinite where one law is 0 and the other is not.
    - 'js_textbook': the Jensen-Shannon divergence 0.5 KL(p1 || m) + 0.5 KL(q1 || m) (at
      most ln 2), what 'js' computed before it followed the reference.
    - 'tv': half the L1 distance.

    A term where both laws are 0 is 0 (torch's 0 * -inf there is NaN; raw target logits are
    finite, so p1 > 0 and m > 0 everywhere)."""
    p1, q1 = _softmax(target_logits), _softmax(draft_logits)

    def kl(a, b):  # sum a log(a / b), 0 where a = 0, inf where a > 0 = b.
        pos = a > 0
        ratio = jnp.log(jnp.where(pos, a, 1.0)) - jnp.log(jnp.where(b > 0, b, 1.0))
        return jnp.where(pos, jnp.where(b > 0, a * ratio, jnp.inf), 0.0).sum(-1)

    if kind == 'kl':
        return kl(q1, p1)
    m = 0.5 * (p1 + q1)
    if kind == 'js':
        return 0.5 * kl(m, p1) + 0.5 * kl(m, q1)
    if kind == 'js_textbook':
        return 0.5 * kl(p1, m) + 0.5 * kl(q1, m)
    return 0.5 * jnp.abs(p1 - q1).sum(-1)


@registry.register
@dataclasses.dataclass(frozen=True)
class Fuzzy(base.Rule):
    """Fuzzy speculative decoding (Holsman et al., arXiv 2502.20704; maxholsman/fsd),
    docs/laws.md §7.3.

    - a(x): position i is accepted iff D(p1_i, q1_i) <= threshold, independent of x (p1, q1
      the T = 1 softmaxes of target and draft; D = `divergence`, as the reference code:
      'kl' KL(q1 || p1), 'js' its js_div 0.5 KL(m || p1) + 0.5 KL(m || q1), m = (p1 + q1)/2,
      'js_textbook' the Jensen-Shannon divergence, 'tv'), scanning to the first failure. It
      accepts positions, not tokens. On p1 = [.88, .1, .005 x4], q1 = [.1, .88, .005 x4]
      the reference 'js' is 0.492 (rejected at the default 0.4), the textbook JS 0.356.
    - Replacement: a sample of the processed target p. Bonus: p.
    - Law at a drafted position: pi = q if D <= threshold, else p. threshold = 0 accepts only
      identical laws (then q = p): lossless.
    - The draft's T = 1 law is recovered from its processed q (`Raw.draft_logits`, T log q):
      where q has zeros (T 0, one-hot; a truncating sampler) 'js' is infinite (KL(m || q1)
      with m > 0 = q1) and every position is rejected; the reference reads the draft's own
      finite logits. Use 'js_textbook' or 'tv' there.
    """

    threshold: float = 0.4
    divergence: str = 'js'

    name = 'fuzzy'
    static_fields = ('divergence',)
    needs_logits = True
    block_level = True
    section = '§7.3'

    def __post_init__(self):
        base.set_field(
            self,
            'threshold',
            base.check_range('fuzzy', 'threshold', self.threshold, 0.0, math.inf,
                             lo_open=False, hi_open=False),  # fmt: skip
        )
        if self.divergence not in DIVERGENCES:
            raise ValueError(f'fuzzy: divergence={self.divergence!r} is not one of {DIVERGENCES}')

    @property
    def lossless(self) -> bool:
        return base.host_equal(self.name, 'lossless', 'threshold', self.threshold, 0.0)

    def accepts(self, raw: contract.Raw, a: int) -> Array:
        """[B, A] bool: D <= threshold at each drafted position."""
        d = divergence(self.divergence, raw.target_logits[:, :a], raw.draft_logits)
        return d <= self.threshold

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        acc = self.accepts(raw, a)
        n = contract.leading_run(acc & (u <= 1.0))
        return contract.block_from(n, a, contract.row_at(p, n), p[:, a], acc)

    def round_law(self, p, q, x, raw):
        a = q.shape[1]
        pi = p[:, -1:]
        if a:
            acc = self.accepts(raw, a)
            pi = jnp.concatenate([jnp.where(acc[..., None], q, p[:, :a]), pi], axis=1)
        return pi

    def replacement(self, p, q):
        return p

    def accept_from(self, px, qx, x, stats):
        _no_token_form(self.name)

    def induced(self, p, q):
        _no_token_form(self.name)
