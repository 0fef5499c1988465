"""Trees sized for the hardware and the batch (spec_jax/decoding/tree_budget.py): the
hand-computed optimum on two synthetic (cost curve, acceptance profile) pairs, a tree that
shrinks as the batch grows, and never below AR on the H200's calibrated costs."""

import ml_collections
import pytest

from spec_jax import sharding
from spec_jax.costs import calibration, chips
from spec_jax.decoding import tree_budget
from spec_jax.decoding.build import tree_config, tree_of
from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.decoding.trees import TreeShape
from spec_jax.jobs import abstract
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig


def test_a_free_draft_and_a_linear_verify_cost_pick_the_hand_computed_chain():
    """Only the head's top token is ever accepted, with 0.8 at every depth; verifying T
    tokens costs 1 + 0.1 (T - 1), drafting nothing. A chain of D: (1 - 0.8^(D+1)) / 0.2
    tokens in 1 + 0.1 D: D 4 2.401, D 5 2.459, D 6 2.470, D 7 2.448 tokens per unit: the
    chain of 6 (7 nodes); a wider tree only adds nodes that are never accepted."""
    acc = tree_budget.Acceptance(((0.8,),))
    choice = tree_budget.choose(acc, lambda t: 1 + 0.1 * (t - 1), lambda d, b: 0.0, batch=1)
    assert choice.shape == TreeShape(7, 6, 1)
    assert choice.expected_tokens == pytest.approx((1 - 0.8**7) / 0.2)
    assert choice.tokens_per_s == pytest.approx(3.951424 / 1.6)
    assert choice.ar_tokens_per_s == 1.0


@pytest.mark.parametrize('batch, nodes', [(1, 5), (4, 2), (8, 1)])
def test_a_roofline_cost_shrinks_the_tree_as_the_batch_grows(batch, nodes):
    """One level (depth 1), ranks accepted with 0.5, 0.2, 0.1, 0.05; verifying T tokens at
    batch b costs max(1, b T / 8) (memory bound up to 8 tokens of the batch), the head's one
    level 0.1. Tokens/s = b (1 + sum of the first M - 1 ranks) / (verify + 0.1), AR b / 1:
    batch 1: M 5 1.85 / 1.1 = 1.68 (M 4 1.64, AR 1); batch 4: M 2 6 / 1.1 = 5.45 (M 3
    6.8 / 1.6 = 4.25, AR 4); batch 8: AR 8 (M 2 12 / 2.1 = 5.71)."""
    acc = tree_budget.Acceptance(((0.5, 0.2, 0.1, 0.05),))
    choice = tree_budget.choose(acc, lambda t: max(1.0, batch * t / 8), lambda d, b: 0.1,
                                batch, max_depth=1)  # fmt: skip
    assert choice.nodes == nodes
    assert (choice.shape is None) == (nodes == 1)
    want = {1: 1.85 / 1.1, 4: 4 * 1.5 / 1.1, 8: 8.0}[batch]
    assert choice.tokens_per_s == pytest.approx(want)


@pytest.mark.parametrize('batch, new_tokens, nodes', [(1, 0, 2), (1, 64, 2), (8, 0, 2),
                                                    (8, 64, 1)])  # fmt: skip
def test_a_batch_that_waits_for_its_slowest_row_sizes_smaller(batch, new_tokens, nodes):
    """The top rank accepted with 0.35, one level, verifying T costs 1 + 0.3 (T - 1) at any
    batch: a draft a round gives 1.35 tokens in 1.3 (1.038 a unit over AR's 1). A batch's
    64 tokens a row: one row needs 64 / 1.35 = 47.4 rounds (the same 1.038); eight rows
    wait for the last, 47.4 + 1.43 x 2.46 = 50.9 rounds: 8 x 64 / (1.3 x 50.9) = 7.74 a unit
    against AR's 8 (decoding/adaptive.py's reading, checked there against simulation)."""
    acc = tree_budget.Acceptance(((0.35,),))
    choice = tree_budget.choose(acc, lambda t: 1 + 0.3 * (t - 1), lambda d, b: 0.0, batch,
                                max_depth=1, max_branch=1, new_tokens=new_tokens)  # fmt: skip
    assert choice.nodes == nodes
    assert choice.ar_tokens_per_s == batch
    rounds = tree_budget.finish_rounds(64, 1.35, 1 + 3 * 0.35, batch)
    assert rounds == pytest.approx({1: 64 / 1.35, 8: 50.90}[batch], abs=0.01)


def test_on_the_h200_calibration_the_tree_shrinks_with_the_batch_and_never_loses_to_ar():
    """Llama-3.1-8B with its EAGLE-3 head, 4,156 slots, an EAGLE-3-like profile: the sized
    tree's predicted tokens/s is at least AR's at every batch, and its nodes fall as the
    batch grows (EAGLE's 60 nodes are right at batch 1, too many at batch 8)."""
    target = ModelConfig.llama3_1_8b().replace(dtype='bfloat16', param_dtype='bfloat16')
    head = abstract.head_config('yuhuili/EAGLE3-LLaMA3.1-Instruct-8B', target)
    acc = tree_budget.Acceptance(((0.75, 0.08, 0.04, 0.02, 0.01),))
    nodes = []
    for batch in (1, 4, 8, 32):
        verify_s, draft_s = calibration.tree_costs(chips.CHIPS['h200'], target, head, batch,
                                                   4156)  # fmt: skip
        choice = tree_budget.choose(acc, verify_s, draft_s, batch)
        assert choice.tokens_per_s >= choice.ar_tokens_per_s
        nodes.append(choice.nodes)
    assert nodes == sorted(nodes, reverse=True) and nodes[0] > 2 * nodes[2]
    with pytest.raises(ValueError, match="chip 'v5e' is uncalibrated; calibrated chips: "):
        calibration.tree_costs(chips.CHIPS['v5e'], target, head, 1, 4156)


def test_acceptance_profiles_are_checked():
    assert tree_budget.Acceptance.parse('0.6,0.1;0.5').rank(3, 1) == 0.5  # The last holds.
    assert tree_budget.Acceptance.parse('0.6,0.1').rank(1, 3) == 0.0
    with pytest.raises(ValueError, match='summing to at most 1'):
        tree_budget.Acceptance.parse('0.9,0.2')
    with pytest.raises(ValueError, match="give rank probabilities per depth as '0.6,0.1;"):
        tree_budget.Acceptance.parse('0.6;x')


def test_a_tree_block_sized_on_a_chip_takes_the_chosen_tree():
    """`spec.tree.sized` at the block's batch_size takes `choose`'s tree on the chip's
    calibrated costs, one node (every round AR) where drafts are rarely accepted; ''
    keeps the block's own shape."""
    target = ModelConfig.tiny()
    drafter = Eagle3Drafter(e3.Eagle3Config.for_target(target, draft_vocab_size=67),
                            sharding.draft_rules('batch'))  # fmt: skip
    c = ml_collections.ConfigDict(dict(batch_size=64, max_prompt_len=64, max_new_tokens=32,
                                       spec=dict(drafter='eagle3',
                                                 tree=tree_config(nodes=6))))  # fmt: skip
    assert tree_of(c, drafter, target) == TreeShape(6, 4, 2)
    verify_s, draft_s = calibration.tree_costs(chips.CHIPS['h200'], target, drafter.cfg, 64, 96)
    c.spec.tree.sized = 'h200'
    for acceptance in ('0.6,0.2', '0.05'):
        c.spec.tree.acceptance = acceptance
        want = tree_budget.choose(tree_budget.Acceptance.parse(acceptance), verify_s, draft_s,
                                  64).shape  # fmt: skip
        assert (want is None) == (acceptance == '0.05')
        assert tree_of(c, drafter, target) == (want or TreeShape(1, 1, 1))
    c.spec.drafter = 'self'
    with pytest.raises(ValueError, match="spec.tree.sized='h200' sizes an EAGLE-3 head's"):
        tree_of(c, None, target)


def test_a_measured_curve_interpolates_linearly_and_extends_its_last_slope():
    cost = tree_budget.interpolated({1: 5.0, 8: 5.0, 16: 7.0, 32: 15.0})
    assert cost(1) == cost(0) == cost(4) == 5.0
    assert cost(12) == pytest.approx(6.0) and cost(24) == pytest.approx(11.0)
    assert cost(64) == pytest.approx(31.0)  # 15 + 0.5 ms a token past T 32.
    assert tree_budget.interpolated({4: 2.0})(60) == 2.0
    with pytest.raises(ValueError, match='needs at least one point'):
        tree_budget.interpolated({})


def test_a_chain_runs_statistics_give_the_top_ranks_acceptance_per_depth():
    """Two rows' counters: position 1 examined 10 + 10 times, accepted 8 + 6; position 2
    examined 8 + 6 (where 1 was accepted), accepted 4 + 3; position 3 never examined."""
    accepted = [[8, 4, 0], [6, 3, 0]]
    reached = [[10, 8, 0], [10, 6, 0]]
    acc = tree_budget.Acceptance.from_chain(accepted, reached, others=(0.1,))
    assert acc.by_depth == ((0.7, 0.1), (0.5, 0.1))
    assert acc.rank(5, 1) == 0.5  # The deepest measured depth holds below.
    with pytest.raises(ValueError, match='no examined drafts'):
        tree_budget.Acceptance.from_chain([[0, 0]], [[0, 0]])
