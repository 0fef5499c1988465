"""Teacher-forced greedy acceptance of a draft on held-out target text.

Given target-greedy responses (tokens with their loss masks, e.g. the train_draft job's
held-out speed prompts), a draft's greedy predictions are compared with the target's tokens
in one forward pass: at greedy verification a round accepts exactly the drafts that match,
so the acceptance lengths computed here are the ones chain or tree speculative decoding would
get on this text, without decoding it. Round lengths count the accepted drafts plus the token
the target adds (the evaluation's `block_efficiency`, spec_jax/eval/metrics.py; its
`accept_length` is one less).

  draft_lm     per-token agreement of a draft LM, chain-k round lengths, agreement per set
  eagle3_head  per-depth agreement of an EAGLE-3 head (its training-time-test forward),
               chain-k and static-tree round lengths, depth-1 agreement per set
  dflash       per-block-position agreement of a DFlash drafter (one block per anchor, as
               it drafts), its chain round lengths
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.models import dflash as df
from spec_jax.models.config import ModelConfig
from spec_jax.models.eagle3 import Eagle3Head
from spec_jax.models.llama import forward
from spec_jax.train import batches, core, shards
from spec_jax.train import dflash as train_dflash
from spec_jax.train.eagle3 import ttt_topk

BUCKET = 64  # Padding bucket of the held-out batches: few compiled shapes.


def chain_lengths(hits_jt: np.ndarray, start: int, last: int, k: int) -> list[int]:
    """Tokens per target call (accepted drafts + 1) of each round of greedy speculation.

    Args:
      hits_jt: [>= k, T] bool; hits_jt[j, r] = the draft at depth j+1 of a round whose root
        (last committed token) is x_{r+1} proposes x_{r+j+2} correctly, given a correct prefix.
      start: r of the first round, whose root is x_{r+1}: r = P - 1 for a prompt of P tokens
        (the root is x_P, the first response token, which prefill produced).
      last: index of the last token of the sequence; drafts past it do not count.
      k: draft length.

    Returns:
      Per-round acceptance lengths, each in [1, k + 1].
    """
    out, r = [], start
    while r + 1 < last:
        a = 0
        while a < k and r + a + 2 <= last and hits_jt[a, r]:
            a += 1
        out.append(a + 1)
        r += a + 1
    return out


def tree_hits(topk_jbtc: np.ndarray, tokens_bt: np.ndarray, branching) -> np.ndarray:
    """[k, B, T] hits of a static tree with `branching[j]` children per node at depth j+1.

    Every node is expanded, so the node on the target's path at depth j exists whenever the
    path matched so far; it matches when the target token is among the top-branching[j].
    """
    k = len(branching)
    b, t = tokens_bt.shape
    hits = np.zeros((k, b, t), bool)
    for j, c in enumerate(branching):
        want = np.zeros((b, t), np.int64) - 1
        want[:, : t - j - 2] = tokens_bt[:, j + 2 :]
        hits[j] = (topk_jbtc[j, :, :, :c] == want[..., None]).any(-1)
    return hits


def tree_size(branching) -> int:
    """Nodes of a static tree with `branching[j]` children per node at depth j+1."""
    n, width = 0, 1
    for c in branching:
        width *= c
        n += width
    return n


def response_span(loss_mask_t: np.ndarray) -> tuple[int, int]:
    """(r of the first round, index of the last token) of a row's response."""
    idx = np.nonzero(loss_mask_t)[0]  # prediction positions of response tokens
    if not idx.size:
        return 0, 0  # no response: no rounds
    # The first response token x_P comes from prefill; the first round's root is x_P,
    # i.e. r = P - 1 = idx[0]. The last token is x_{idx[-1] + 1}.
    return int(idx[0]), int(idx[-1]) + 1


def draft_lm(
    target,
    dcfg: ModelConfig,
    dparams,
    examples: Sequence[shards.Example],
    sources: Sequence[str],
    *,
    chain: int,
    batch_size: int,
    seq_len: int,
) -> dict:
    """A draft LM's acceptance on `examples` (the target's greedy text; `sources[i]` names
    example i's set): per-token agreement, chain-`chain` round lengths, agreement per set."""
    agree, total, lengths, per_set = 0, 0, [], {}
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        b = batches.make_batch(chunk, seq_len, BUCKET)
        tokens, valid = jnp.asarray(b.tokens_bt), jnp.asarray(b.valid_bt)
        pos, mask = core.positions(*tokens.shape), core.causal_mask(valid)
        t_arg, d_arg = _argmaxes(target.cfg, dcfg, target.params, dparams, tokens, pos, mask)
        g = np.asarray(t_arg == d_arg) & b.loss_mask_bt
        agree += int(g.sum())
        total += int(b.loss_mask_bt.sum())
        for row in range(len(chunk)):
            hits = np.stack([np.roll(g[row], -(j + 1)) for j in range(chain)])  # g[r+j+1]
            start, last = response_span(b.loss_mask_bt[row])
            lengths += chain_lengths(hits, start, last, chain)
            counts = per_set.setdefault(sources[i + row], [0, 0])
            counts[0] += int(g[row].sum())
            counts[1] += int(b.loss_mask_bt[row].sum())
    return dict(
        per_token_acceptance=agree / max(total, 1),
        tokens=total,
        per_set=_per_set(per_set),
        **{f'chain{chain}_{key}': v for key, v in _round_stats(lengths).items()},
    )


def eagle3_head(
    target,
    head: Eagle3Head,
    examples: Sequence[shards.Example],
    sources: Sequence[str],
    *,
    chain: int,
    tree: Sequence[int],
    batch_size: int,
    seq_len: int,
) -> dict:
    """An EAGLE-3 head's acceptance on `examples`: per-depth agreement, chain-`chain` and
    static-tree (`tree[j]` children per node at depth j+1) round lengths, depth-1 agreement
    per set."""
    branching = tuple(tree)
    depth = max(chain, len(branching))
    chains, trees, hit_sum, hit_n, per_set = [], [], np.zeros(depth), np.zeros(depth), {}
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        b = batches.make_batch(chunk, seq_len, BUCKET)
        topk = np.asarray(
            ttt_topk(
                target.cfg,
                head.cfg,
                target.params,
                head.params,
                head.draft_ids_u,
                jnp.asarray(b.tokens_bt),
                jnp.asarray(b.valid_bt),
                depth,
                max(branching),
            )
        )
        hits1 = tree_hits(topk, b.tokens_bt, (1,) * depth)
        hitsb = tree_hits(topk, b.tokens_bt, branching)
        for row in range(len(chunk)):
            start, last = response_span(b.loss_mask_bt[row])
            chains += chain_lengths(hits1[:, row], start, last, chain)
            trees += chain_lengths(hitsb[:, row], start, last, len(branching))
            for j in range(depth):
                hit_sum[j] += hits1[j, row, start : last - j - 1].sum()
                hit_n[j] += max(last - j - 1 - start, 0)
            counts = per_set.setdefault(sources[i + row], [0, 0])  # depth 1
            counts[0] += int(hits1[0, row, start : last - 1].sum())
            counts[1] += max(last - 1 - start, 0)
    return dict(
        depth_agreement=(hit_sum / np.maximum(hit_n, 1)).round(4).tolist(),
        per_set=_per_set(per_set),
        tree_nodes=tree_size(branching),
        tree_branching=list(branching),
        **{f'chain{chain}_{key}': v for key, v in _round_stats(chains).items()},
        **{f'tree_{key}': v for key, v in _round_stats(trees).items()},
    )


def dflash(target, cfg: df.DFlashConfig, params: dict, examples: Sequence[shards.Example],
           *, seq_len: int, anchors: int = 32) -> dict:  # fmt: skip
    """A DFlash drafter's acceptance on `examples`: at every anchor a of each response (block
    [x_a, mask, ...] over the target's taps below a: exactly its inference block), position
    j's greedy agreement with x_{a+j} (the marginal, given x_a right), and the greedy chain's
    round lengths (drafts accepted while they match, + 1). `params` are the drafter's."""
    head_vd = target.params.get('lm_head_vd', target.params['embed_vd'])
    k = cfg.block_size - 1
    hit_sum, hit_n, rounds = np.zeros(k), np.zeros(k), []
    for e in examples:
        b = batches.make_batch([e], seq_len, BUCKET)
        start, last = response_span(b.loss_mask_bt[0])
        if last - start < 2:
            continue
        taps = core.teacher_taps(target.cfg, target.params, jnp.asarray(b.tokens_bt),
                                 jnp.asarray(b.valid_bt), cfg.taps)  # fmt: skip
        roots = np.arange(start + 1, last)  # Anchor a = r + 1: root x_{r+1}.
        argmax_aj = []
        for s in range(0, len(roots), anchors):
            chunk = np.resize(roots[s : s + anchors], anchors)[None].astype(np.int32)
            argmax_aj.append(_block_argmax(cfg, params, target.params['embed_vd'], head_vd,
                                           taps, jnp.asarray(b.tokens_bt), chunk)[0])  # fmt: skip
        argmax_aj = np.concatenate(argmax_aj)[: len(roots)]
        tokens = b.tokens_bt[0]
        hits_jt = np.zeros((k, b.tokens_bt.shape[1]), bool)
        for j in range(k):
            inside = roots + j + 1 <= last
            a = roots[inside]
            hits_jt[j, a - 1] = argmax_aj[inside, j] == tokens[a + j + 1]
            hit_sum[j] += hits_jt[j, a - 1].sum()
            hit_n[j] += inside.sum()
        rounds += chain_lengths(hits_jt, start, last, k)
    return dict(
        position_agreement=(hit_sum / np.maximum(hit_n, 1)).round(4).tolist(),
        positions=hit_n.astype(int).tolist(),
        **{f'chain{k}_{key}': v for key, v in _round_stats(rounds).items()},
    )


@partial(jax.jit, static_argnums=0)
def _block_argmax(cfg, params, embed_vd, head_vd, taps, tokens, anchors_bn):
    logits = train_dflash.block_logits(cfg, params, embed_vd, head_vd, taps, tokens, anchors_bn)
    return jnp.argmax(logits, -1)


def _per_set(hits: dict[str, list[int]]) -> dict:
    """{set: [hits, tokens]} -> {set: {'agreement', 'tokens'}}."""
    return {
        name: dict(agreement=round(h / max(n, 1), 4), tokens=n)
        for name, (h, n) in sorted(hits.items())
    }


def _round_stats(lengths: list[int]) -> dict:
    return dict(mean_accept_len=float(np.mean(lengths)) if lengths else 0.0, rounds=len(lengths))


@partial(jax.jit, static_argnums=(0, 1))
def _argmaxes(tcfg, dcfg, tparams, dparams, tokens, pos, mask):
    t, _, _ = forward(tcfg, tparams, tokens, pos, None, mask)
    d, _, _ = forward(dcfg, dparams, tokens, pos, None, mask)
    return jnp.argmax(t, -1), jnp.argmax(d, -1)
