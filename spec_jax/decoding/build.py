"""One entry point from a config block to a ready engine: `build(c) -> Built`.

The block (configs built on `spec_jax.jobs.generate.default_config` carry it):

  model, dtype, seed                 the target (`checkpoints.load` spec) and its dtype
  max_new_tokens, max_prompt_len, prompt_bucket
  sampling                           `sampling_config()`: temperature and truncations
  spec                               `spec_config()`: mode ('ar', 'chain' or 'tree'),
                                     drafter, draft, num_draft, ngram, lookup, rule,
                                     baseline, meter_distortion, tree (the tree's shape),
                                     adaptive (draft lengths or trees sized online)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from spec_jax import checkpoints, rules, sharding
from spec_jax.costs import calibration, chips
from spec_jax.decoding import drafters, tree_budget, trees
from spec_jax.decoding.adaptive import Adaptive, TierCosts, tree_tiers
from spec_jax.decoding.drafters import measured as measured_prior
from spec_jax.decoding.drafters.eagle3 import FOLLOW_EVERY
from spec_jax.decoding.drafters.lm import PREFILL_CHUNKS
from spec_jax.decoding.engine import MODES, Engine
from spec_jax.decoding.host import Params
from spec_jax.decoding.state import DecodeSettings
from spec_jax.sampling import Sampler


def sampling_config(temperature: float = 0.0) -> ml_collections.ConfigDict:
    """The sampling block: every transform switched off but temperature (0 = greedy)."""
    return ml_collections.ConfigDict(
        dict(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
             epsilon=0.0, eta=0.0)
    )  # fmt: skip


def sampler_from_config(c: ml_collections.ConfigDict) -> Sampler:
    """A Sampler from a sampling block; 0 / 1.0 values switch a truncation off."""
    return Sampler(
        temperature=c.temperature,
        top_k=c.top_k or None,
        top_p=None if c.top_p >= 1.0 else c.top_p,
        min_p=c.min_p or None,
        typical_p=None if c.typical_p >= 1.0 else c.typical_p,
        epsilon=c.epsilon or None,
        eta=c.eta or None,
    )


def tree_config(
    nodes: int = 8, depth: int = 4, branch: int = 2, static: str = '', sampled: str = '',
    sized: str = '', acceptance: str = '',
):  # fmt: skip
    """The tree block of `spec_config` (tree mode; configs/smollm2_135m_tree.py)."""
    return ml_collections.ConfigDict(
        dict(
            nodes=nodes,  # M: nodes verified per round, the root (pending token) included.
            depth=depth,  # The deepest drafted node: the most drafts a round accepts.
            branch=branch,  # Children per expanded node (the head's top-k) and frontier size.
            # A static tree instead (EAGLE-1 / Medusa): parents of nodes 1..M-1, comma
            # separated ('0,0,1,1,2': two root children, two under the first, one under the
            # second); 'chain:A' for a chain of A. nodes, depth and branch then follow from it.
            static=static,
            # A static tree's children drawn from the head's processed law instead of its
            # top-ranked tokens (EAGLE): 'iid' (SpecInfer) or 'distinct' (without
            # replacement); lossless rule only.
            sampled=sampled,
            # A calibrated chip ('h200'): nodes, depth and branch chosen for the block's
            # batch_size from the chip's calibrated verify cost and the head's `acceptance`
            # (rank probabilities per depth, '0.75,0.08;0.7,0.1': decoding/tree_budget.py)
            # instead of the three above; '' keeps them (the paper setups: EAGLE's tree).
            sized=sized,
            acceptance=acceptance,
        )
    )


def tree_shape(c: ml_collections.ConfigDict) -> trees.TreeShape:
    """A TreeShape from a tree block (ValueError naming the bad field)."""
    if not c.static:
        if c.sampled:
            raise ValueError(
                f'spec.tree.sampled={c.sampled!r} needs a static tree (spec.tree.static)'
            )
        return trees.TreeShape(c.nodes, c.depth, c.branch)
    if c.static.startswith('chain:'):
        return trees.TreeShape.chain(int(c.static.split(':', 1)[1]), c.sampled)
    try:
        parents = [int(v) for v in c.static.split(',')]
    except ValueError:
        raise ValueError(
            f'spec.tree.static={c.static!r}: give the parents of nodes 1..M-1 as '
            "comma-separated ints ('0,0,1'), or 'chain:A'"
        ) from None
    return trees.TreeShape.fixed([0] + parents, c.sampled)


def tree_of(c: ml_collections.ConfigDict, drafter, target) -> trees.TreeShape:
    """The block's tree: its shape, or one sized for its batch on a calibrated chip."""
    t = c.spec.tree
    if not t.get('sized'):
        return tree_shape(t)
    if c.spec.drafter != 'eagle3':
        raise ValueError(f'spec.tree.sized={t.sized!r} sizes an EAGLE-3 head\'s tree; '
                         f'set spec.drafter to \'eagle3\' (got {c.spec.drafter!r})')
    verify_s, draft_s = calibration.tree_costs(
        chips.chip(t.sized), target, drafter.cfg, int(c.get('batch_size', 1)),
        c.max_prompt_len + c.max_new_tokens,
    )  # fmt: skip
    choice = tree_budget.choose(tree_budget.Acceptance.parse(t.acceptance), verify_s, draft_s,
                                int(c.get('batch_size', 1)), new_tokens=c.max_new_tokens)
    print(f'tree sized for batch {c.get("batch_size", 1)} on {t.sized}: {choice.describe()}')
    return choice.shape or trees.TreeShape(1, 1, 1)  # One node: every round an AR step.


def adaptive_config(tiers: str = '', costs: str = '') -> ml_collections.ConfigDict:
    """The adaptive block of `spec_config` (chain and tree mode; decoding/adaptive.py)."""
    return ml_collections.ConfigDict(
        dict(
            # Draft lengths compiled once, one chosen each round on device: '' off, 'auto'
            # (0, the powers of two below num_draft, num_draft) or '0,1,3' (0 = an AR step;
            # the last one num_draft). Tree mode: node budgets ('0,4,8', the last the tree's
            # nodes: trees cut from the configured one, adaptive.tree_tiers) or 'auto' (AR,
            # the chain of its path, a tree of half its nodes, the tree).
            tiers=tiers,
            # Seconds of a round of each tier at context 0, one per tier ('1,1.3,1.6,2.2',
            # any unit: a bench's measurements); 'chip:h200' a calibrated chip's cost model
            # (spec_jax.costs) at the run's slots ('chip:cpu': this machine's bench); 'auto'
            # the chip of the platform's first device; '' the relative model below.
            costs=costs,
            per_token='',  # Seconds each tier's round adds per context token ('' = 0).
            # The relative model (units of an AR step): tier k costs 1 + verify k +
            # draft k, plus context (k + 1) per context token (a tree of M nodes: k = M - 1
            # verified, its drafted levels as draft calls); the AR tier adds its drafter's
            # follow (none for a draft LM or a buffering head: FOLLOW_CALLS).
            verify=0.18,
            draft=0.15,
            context=0.0,
            # Per token a lagging draft LM feeds before it drafts (after AR rounds; its
            # deferred prefill), in the costs' units; a buffering head's catch-up is its
            # windows (HEAD_WINDOW_CALLS), other drafters never lag; 'chip:' costs price it
            # themselves (this CPU measured 0.0015 of an AR step at batch 1,
            # 0.0044 at batch 8).
            catch_up=0.003,
            # Acceptance assumed before any round: with prior_from 'drafter', what the
            # drafter was measured to accept per depth (its directory's acceptance.json at
            # this lookup: decoding/drafters/measured.py, configs/bench_prior.py) where it
            # has one, else `prior` at every depth; '' always `prior`.
            prior=0.7,
            prior_from='drafter',
            weight=4.0,  # Rounds the prior (and per row the batch's rate) counts as.
            # Every explore-th round runs the tier above the choice (0: never) when the look
            # pays for itself at an acceptance `optimism` standard errors up (adaptive.py).
            explore=16,
            optimism=1.645,
        )
    )


# Batch sizes a chip's tier costs are read at (the loop interpolates at its own).
CHIP_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# A buffering head's window over its FOLLOW_EVERY positions in draft calls (one-token steps
# with the draft vocabulary's logits), for the relative model: the shipped head's 16-wide
# window took 2.8 ms at batch 1 and 14.2 at batch 8 on this CPU, one token's window (no
# logits) 1.3 and 3.3, and its logits (576 x 8,192) about as many FLOPs as the rest of a
# step: about 1 and 2 draft calls; 2, the upper one.
HEAD_WINDOW_CALLS = 2.0
# Draft calls a step of the adaptive AR tier's `Drafter.follow` by spec.drafter (default 1:
# DFlash reads the step's taps, the target itself re-feeds two tokens); a draft LM makes
# none (it catches up when it next drafts), nor does an EAGLE-3 head, which buffers its
# taps (`Eagle3Drafter.capacity`) and runs over them in `WINDOWS`-wide windows before it
# next drafts (or, unpriced, when its capacity is full: `head_follow`).
FOLLOW_CALLS = {'lm': 0.0, 'eagle3': 0.0}
WINDOWS = {'eagle3': FOLLOW_EVERY}


def chip_tier_costs(chip: str, tiers, target, drafter, kind: str, slots: int,
                    tree: trees.TreeShape | None = None, shapes=()) -> TierCosts:  # fmt: skip
    """`tiers`' round costs from `chip`'s calibrated model (`costs.calibration`) at
    `CHIP_BATCHES` and `slots` cache slots, no context term (the engine's attention reads
    every slot). Tier k > 0: a chain of k drafted by `kind` ('lm', 'eagle3'), or `tree`
    (tier i > 0 of tree mode's `shapes`: that tree); tier 0: AR's step plus the drafter's
    `follow` as the adaptive engine runs it (`deferred()`; `head_follow` for a head); a
    draft LM nothing: it catches up when it next drafts. The catch-up (`TierCosts`): a
    draft LM's `catch_up`-wide forward plus its widest prefill chunk's price a token; a
    head's as `head_follow` says."""
    if kind not in ('lm', 'eagle3'):
        raise ValueError(f"spec.adaptive.costs='chip:{chip}' prices drafters 'lm' and "
                         f"'eagle3'; got {kind!r}")
    base = getattr(drafter, 'base', drafter)  # Prompt lookup prices its model drafter.
    model = calibration.for_chip(chip, target, **{'head' if kind == 'eagle3' else 'draft':
                                                  base.cfg})  # fmt: skip
    head = [head_follow(model, base.deferred(), b, slots) for b in CHIP_BATCHES] if (
        kind == 'eagle3') else [(0.0, None, None)] * len(CHIP_BATCHES)  # fmt: skip

    def tier(i, k):
        if not k:
            return calibration.Tier('ar')
        if shapes:
            return calibration.Tier.tree(shapes[i - 1])
        return calibration.Tier.chain(k, kind) if tree is None else calibration.Tier.tree(tree)

    at = [[model.round_s(tier(i, k), b, slots) + (0.0 if k else step) for b, (step, _, _)
           in zip(CHIP_BATCHES, head)] for i, k in enumerate(tiers)]  # fmt: skip
    per = least = None
    if kind == 'lm':
        width = PREFILL_CHUNKS[0]
        per = [model.feed_s(b, width, slots) / width for b in CHIP_BATCHES]
        least = [model.feed_s(b, base.catch_up, slots) for b in CHIP_BATCHES]
    elif head[0][1] is not None:
        least, per = [h[1] for h in head], [h[2] for h in head]
    return TierCosts.table(at, batch_n=CHIP_BATCHES, catch_up_n=per, catch_up_base_n=least)


def head_follow(model, head, batch: int, slots: int):
    """(seconds a step of the AR tier, catch-up base, catch-up a token) of an EAGLE-3 head
    `head` following AR steps (`Eagle3Drafter.follow`), from its layer over W positions
    without logits (`CostModel.follow_s`, W its `follow_every`): one that runs every step
    pays its one-token window a step and never lags (None, None); one that runs a window
    when W are buffered pays a W-th of it a step, and drafting at a lag of L the window's
    unused W - L positions (base a window, less a W-th of it a token: the AR tier paid
    those); one that buffers more than W (`capacity`, the adaptive engine's lazy head)
    pays nothing a step and, drafting at a lag of L, ceil(L / W) windows (priced a window
    plus a W-th of one a token, an upper reading by at most a window; its lag counts a
    buffered prompt; a run whose prompt and AR steps pass `capacity` positions pays the
    windows then too, not priced)."""
    w = max(head.follow_every, 1)
    window = model.follow_s(batch, slots, w)
    if w == 1:
        return window, None, None
    if head.buffer > w:
        return 0.0, window, window / w
    return window / w, window, -window / w


def platform_chip() -> str:
    """The chip of this process's first device ('cpu' on a CPU), for `costs='auto'`."""
    device = jax.devices()[0]
    found = chips.of_device(device)
    if found is None:
        raise ValueError(f"spec.adaptive.costs='auto': device kind {device.device_kind!r} is no "
                         f"known chip; name one: 'chip:NAME', NAME of {sorted(chips.CHIPS)}")
    return found.name


def adaptive_of(c: ml_collections.ConfigDict, mode: str, num_draft: int, chip_costs=None,
                tree: trees.TreeShape | None = None, drafter: str = '',
                measured: tuple[tuple[float, ...], str] | None = None,
                ) -> Adaptive | None:  # fmt: skip
    """The engine's `Adaptive` from an adaptive block (None when `tiers` is ''); `chip_costs`
    (chip, tiers[, shapes]) -> TierCosts reads 'chip:NAME' costs (`build`: `chip_tier_costs`);
    `tree`: tree mode's tree (its tiers: `adaptive.tree_tiers`); `drafter`: spec.drafter,
    the AR tier's follow in the relative model (`FOLLOW_CALLS`, `WINDOWS`); `measured`:
    the drafter's measured prior and its source (`drafters.measured.prior`), the prior
    where `prior_from` is 'drafter' (printed, with where it came from)."""
    if not c.tiers:
        return None
    if mode == 'ar':
        raise ValueError(f'spec.adaptive.tiers={c.tiers!r} sizes speculative rounds: set '
                         f"spec.mode to 'chain' or 'tree' (got {mode!r}) or tiers to ''")
    shapes = () if tree is None else tree_tiers(tree, c.tiers)
    tiers = (0, *(t.nodes for t in shapes)) if shapes else Adaptive.parse_tiers(c.tiers, num_draft)
    if not c.costs:
        per, least = c.catch_up, 0.0
        if drafter in WINDOWS:  # Drafting at a lag of L: ceil(L / W) windows, an upper reading.
            least = HEAD_WINDOW_CALLS * c.draft
            per = least / WINDOWS[drafter]
        costs = TierCosts.relative(tiers, c.verify, c.draft, c.context, shapes,
                                   FOLLOW_CALLS.get(drafter, 1.0), per, least)  # fmt: skip
    elif (c.costs == 'auto' or c.costs.startswith('chip:')) and chip_costs is not None:
        name = platform_chip() if c.costs == 'auto' else c.costs[5:]
        costs = chip_costs(name, tiers, shapes) if shapes else chip_costs(name, tiers)
    else:
        try:
            base = [float(v) for v in c.costs.split(',')]
            per = [float(v) for v in c.per_token.split(',')] if c.per_token else None
        except ValueError:
            raise ValueError(f'spec.adaptive.costs={c.costs!r}, per_token={c.per_token!r}: give '
                             "one number per tier, comma separated ('1,1.3,1.6')") from None
        if len(base) != len(tiers) or (per is not None and len(per) != len(tiers)):
            raise ValueError(f'spec.adaptive.costs={c.costs!r}, per_token={c.per_token!r}: '
                             f'give one number per tier {tiers}')
        costs = TierCosts.table(base, per, catch_up_n=c.catch_up)
    prior = c.prior
    source = c.get('prior_from', 'drafter')
    if source not in ('drafter', ''):
        raise ValueError(f"spec.adaptive.prior_from={source!r}: give 'drafter' (its measured "
                         "acceptance where it has one) or '' (spec.adaptive.prior)")
    if source and measured is not None:
        prior = np.asarray(measured[0], np.float32)
        depths = 'depth 1' if prior.size == 1 else f'depths 1-{prior.size}'
        print(f'adaptive prior {", ".join(f"{r:.3f}" for r in measured[0])} ({depths}), '
              f'measured: {measured[1]}')
    elif source:
        print(f'adaptive prior {prior} (spec.adaptive.prior): the drafter has no measured '
              f'acceptance ({measured_prior.FILE}) at this lookup')
    return Adaptive(tiers, costs, prior, c.weight, c.explore, c.optimism, shapes)


def spec_config(mode: str = 'ar', draft: str = '') -> ml_collections.ConfigDict:
    """The decoding-mode block (see configs/smollm2_135m_chain.py)."""
    return ml_collections.ConfigDict(
        dict(
            # 'ar' (plain decoding), 'chain' (speculative, drafter below) or 'tree' (EAGLE-3
            # draft trees of shape `tree`: drafter 'eagle3', lookup 0).
            mode=mode,
            # 'lm' (a draft LM at `draft`), 'eagle3' (an EAGLE-3 head directory at `draft`,
            # official or speculators layout), 'dflash' (a DFlash drafter directory as
            # released; tree mode: DDTree) or 'ngram' (prompt lookup).
            drafter='lm',
            draft=draft,  # The draft LM's checkpoint spec (same tokenizer) or the head's dir.
            draft_seed=-1,  # Seed of 'random:' draft weights (-1: the target's seed).
            num_draft=5,  # gamma: drafted tokens per block.
            ngram=3,  # Longest n-gram prompt lookup matches ('ngram' drafter, `lookup`).
            # k > 0: prompt lookup first: where the last n tokens (ngram >= n >= k) occurred
            # earlier, the tokens that followed are drafted; the 'lm' / 'eagle3' drafter
            # drafts the rest (drafters.PromptLookup). 0: off.
            lookup=0,
            # A spec_jax.rules name, with parameters: 'lenience:l=0.5'. In AR mode the rule's
            # bonus law is sampled (lossless: the target; greedy: its argmax).
            rule='lossless',
            baseline=False,  # Run the rule's matched baseline (truncation + lossless) instead.
            meter_distortion=False,  # Per-position TV / overshoot against the matched baseline.
            tree=tree_config(),
            adaptive=adaptive_config(),  # Each round's size chosen online (chain, tree).
            # How a draft LM's or head's weights and cache split on a mesh
            # (sharding.DRAFT_SHARDINGS): 'batch' (rows over 'data', weights on every device)
            # or 'heads' (its attention split over 'model' as the target's, when its
            # attention on every device would not fit: an EAGLE-3 head's long prefills).
            draft_sharding='batch',
        )
    )


class Built(NamedTuple):
    """What `build` returns."""

    engine: Engine
    params: Params
    tokenizer: object
    target: checkpoints.LoadedModel


def build(c: ml_collections.ConfigDict) -> Built:
    """Loads the target (and the draft) and builds the engine of config block `c`.

    Raises:
      ValueError: an unknown mode, drafter or rule, a drafter that does not fit the target,
        bad sampling values (all before anything compiles).
    """
    s = c.spec
    if s.mode not in MODES:
        raise ValueError(f'spec.mode={s.mode!r} is not one of {MODES}')
    rule = rules.make(s.rule)
    sampler = sampler_from_config(c.sampling)
    mesh = sharding.make_mesh(c.mesh) if 'mesh' in c else None
    # Heads, MLP and vocabulary over 'model' (an orbax target restored into its shards).
    target = checkpoints.load(
        c.model, c.dtype, c.seed, mesh=mesh, quantize=c.get('weights') or None,
        scan_layers=bool(c.get('scan_layers', False)),
    )  # fmt: skip
    tok = target.tokenizer
    decode = DecodeSettings(
        max_new_tokens=c.max_new_tokens,
        stop_tokens=tok.stop_ids if tok else (),
        max_prompt_len=c.max_prompt_len,
        prompt_bucket=c.prompt_bucket,
        pad_id=(tok.pad_id or 0) if tok else 0,
    )
    if s.mode == 'tree' and (s.drafter not in ('eagle3', 'self', 'dflash') or s.lookup):
        raise ValueError(
            f'spec.mode=tree drafts with an EAGLE-3 head, a DFlash drafter (DDTree) or the '
            f"target itself: set spec.drafter to 'eagle3', 'dflash' or 'self' (got "
            f'{s.drafter!r}) and spec.lookup=0 (got {s.lookup})'
        )
    kind = 'none' if s.mode == 'ar' else s.drafter
    draft = drafters.make(
        kind, target, s.draft, ngram=s.ngram, lookup=s.lookup, dtype=c.dtype,
        seed=c.seed if s.draft_seed < 0 else s.draft_seed,
        rules=sharding.draft_rules(s.get('draft_sharding', 'batch')),
    )  # fmt: skip
    tree = tree_of(c, draft.drafter, target.cfg) if s.mode == 'tree' else None

    def chip_costs(chip, tiers, shapes=()):
        slots = c.max_prompt_len + c.max_new_tokens
        return chip_tier_costs(chip, tiers, target.cfg, draft.drafter, s.drafter, slots, tree,
                               shapes)  # fmt: skip

    num_draft = tree.path_len if tree is not None else s.num_draft
    engine = Engine(
        target.cfg,
        decode,
        draft.drafter,
        s.num_draft if s.mode == 'chain' else 0,
        rule,
        bool(s.baseline),
        sampler,
        bool(s.meter_distortion),
        tree,
        adaptive_of(s.adaptive, s.mode, num_draft, chip_costs, tree,
                    s.drafter, measured_prior.prior(s.draft, s.drafter, s.lookup))
        if 'adaptive' in s and s.adaptive.tiers else None,
    )
    engine.check()
    params = Params(target.params, sharding.shard(draft.params, mesh, draft.drafter.rules))
    return Built(engine, params, tok, target)
