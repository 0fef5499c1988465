"""Train an EAGLE-3 head for the embedded default (SmolLM2-135M-Instruct).

    python launch/train_draft.py --config configs/smollm2_135m_eagle3.py --workdir runs/e3
    python launch/train_draft.py --config configs/smollm2_135m_eagle3.py:tiny --workdir /tmp/e

One decoder layer over fc(concat of the target's taps [2, L//2, L-3]), a reduced draft
vocabulary (the most frequent response tokens), the training-time test with 7 unrolled
steps and weights 0.8**j; exported in the official EAGLE-3 layout (bf16 safetensors).
"""

import importlib.util
import os

import ml_collections


def _draft_config_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'smollm2_135m_draft.py')
    spec = importlib.util.spec_from_file_location('smollm2_135m_draft', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tiny = arg == 'tiny'
    c = _draft_config_module().get_config(arg)
    c.kind = 'eagle3'
    c.model = ml_collections.ConfigDict()
    c.model.draft_vocab_size = 48 if tiny else 8192
    # Midlayer sizes; 0 = the target's (the official recipe: one target-shaped layer).
    c.model.num_heads = 0
    c.model.num_kv_heads = 0
    c.model.head_dim = 0
    c.model.mlp_width = 0
    # True: lm_head from the target's head rows, norm from its final norm, fc = identity on
    # the high tap. Measured on the embedded default it learned SLOWER (TTT step-0 agreement
    # 0.12 vs 0.18 at step 15, B4 x T256, lr 2e-3: large initial logits), so it is off.
    c.model.init_from_target = False
    # An exported head directory (official or speculators layout) to fine-tune: its sizes
    # and draft vocabulary replace the settings above. '' = a new head.
    c.model.init_from = ''
    # > 0: the target's top-k law and taps are stored once per token beside the shards
    # (about 3.6 KB a token) and training runs no target forward: measured 2.0 s of a
    # 10.3 s step at B4 x T320 (7 TTT steps) on 2 CPU cores. 0: the target runs every step
    # (exact full-vocabulary soft targets, no disk).
    c.train.teacher_topk = 4 if tiny else 16
    c.train.ttt_steps = 7
    c.train.step_weight = 0.8
    c.train.lr = 1e-3 if not tiny else 3e-3
    c.train.batch_size = 4 if tiny else 4
    c.train.seq_len = 64 if tiny else 320
    c.export.format = 'official'
    return c
