"""The draft-training job's config: every field and its default (`default_config`), for
configs/smollm2_135m_draft.py and configs/smollm2_135m_eagle3.py and any other target.

Stages (each resumable in the workdir; spec_jax/jobs/train_draft.py): self-distillation
data (the target writes user prompts itself, then answers them and GSM8K-train /
unevaluated MBPP prompts, greedy), distillation on response tokens (hard-label CE,
optionally KL to the target's logits or its stored top-k law), held-out acceptance on the
speed prompts, export (an HF directory for a draft LM, the official EAGLE-3 layout for a
head).
"""

from __future__ import annotations

import ml_collections

KINDS = ('draft_lm', 'eagle3')


def default_config(kind: str = 'draft_lm', tiny: bool = False) -> ml_collections.ConfigDict:
    """The training job's config with every field and its default, for the embedded
    default target: `kind` 'draft_lm' (a distilled draft LM) or 'eagle3' (an EAGLE-3
    head; its fields under `model` and `train` added); `tiny`: a random tiny target and
    sizes that run every stage in about a minute."""
    if kind not in KINDS:
        raise ValueError(f'kind={kind!r} is not one of {KINDS}')
    c = ml_collections.ConfigDict()
    c.kind = kind
    c.target = 'random:tiny' if tiny else 'embedded'
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.generate = True
    # The directory holding the data files (gsm8k/train.jsonl, mbpp/, mbppplus/, bfcl/,
    # speed/, ... as spec_jax/data_files.py lays out); '' = $SPEC_JAX_DATA, else the samples
    # bundled in the package (spec_jax/assets/data: 128 GSM8K-train prompts, 10 MBPP).
    c.data.root = ''
    c.data.dir = ''  # '' = <workdir>/data; point several runs at one data directory.
    c.data.extra_dirs = ()  # More finished data directories to train on (not generated).
    # 'self_instruct': user prompts the target writes itself (chat coverage; see below).
    c.data.sources = ('self_instruct', 'gsm8k', 'mbpp') if not tiny else ('gsm8k', 'mbpp')
    c.data.self_instruct = self_instruct_config(tiny)
    # 'summarize': "Summarize: <text>" prompts over the responses stored in these finished
    # data directories (the target's own answers serve as documents).
    c.data.summarize_dirs = ()
    c.data.num_prompts = 32 if tiny else 0  # 0 = all (about 8.7k prompts).
    c.data.batch_size = 16 if tiny else 64
    c.data.max_new_tokens = 16 if tiny else 128
    c.data.max_prompt_len = 512
    c.data.seconds = 0.0  # Time budget for generation (0 = no limit); rerun to continue.
    c.data.seed = 0
    # Extra distillation text: the datasets' own answers as assistant turns (no generation;
    # the loss is still KL to the target's logits). () to disable.
    c.data.reference = ()  # e.g. ('gsm8k', 'mbpp')
    c.data.reference_limit = 0

    c.model = ml_collections.ConfigDict()
    c.model.width = 32 if tiny else 192
    c.model.num_layers = 2 if tiny else 6
    c.model.num_heads = 4 if tiny else 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 8 if tiny else 48
    c.model.mlp_width = 64 if tiny else 768
    c.model.init_embedding = 'project'  # 'project' (target PCA) or 'random'.

    c.train = ml_collections.ConfigDict()
    c.train.steps = 30 if tiny else 1000
    c.train.seconds = 0.0  # Wall-clock budget (0 = none): checkpoint and stop when spent.
    c.train.batch_size = 4 if tiny else 8
    c.train.seq_len = 64 if tiny else 320
    c.train.bucket = 32 if tiny else 64
    c.train.lr = 3e-3
    c.train.warmup = 5 if tiny else 50
    c.train.clip = 1.0
    c.train.weight_decay = 0.0
    c.train.temperature = 1.0
    # First steps: hard-label cross-entropy on the training text (no teacher forward, about
    # 5x cheaper), then KL to the target's logits. On target-greedy text the next token IS
    # the target's argmax, so CE alone trains greedy acceptance; KL (ce_steps < steps)
    # also matches the target's spread (sampled verification) and is needed for `reference`
    # text, whose next token is not the target's.
    # -1 = every step, also when --config.train.steps is overridden.
    c.train.ce_steps = 10 if tiny else -1
    # k > 0: the "CE" steps learn the target's top-k next-token law instead of its argmax
    # (soft labels: one teacher forward per token, stored next to each data shard as
    # top<k>_NNNNN.npz, instead of one per step as KL needs). Measured on the embedded
    # default with 522 k tokens: 0.336 held-out acceptance at k 16 vs 0.334 with hard labels.
    c.train.teacher_topk = 0
    c.train.seed = 0
    c.train.checkpoint_every = 10 if tiny else 200
    c.train.log_every = 5 if tiny else 20

    c.eval = eval_config(tiny)
    c.export = ml_collections.ConfigDict()
    c.export.dir = ''  # e.g. spec_jax/assets/drafts/smollm2_135m_draft
    c.export.dtype = 'bfloat16'
    if kind == 'eagle3':
        eagle3_fields(c, tiny)
    return c


def eagle3_fields(c: ml_collections.ConfigDict, tiny: bool) -> None:
    """An EAGLE-3 head's fields: one decoder layer over fc(concat of the target's taps), a
    reduced draft vocabulary, the training-time test; exported in the official layout."""
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
    # EAGLE-3.1 (docs/eagle3.md §1): an RMSNorm per tap before fc; the normed output fed back.
    c.model.fc_norm = False
    c.model.norm_output = False
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


def self_instruct_config(tiny: bool) -> ml_collections.ConfigDict:
    s = ml_collections.ConfigDict()
    s.num_prompts = 16 if tiny else 1536
    s.batch_size = 8 if tiny else 64
    s.max_tokens = 8 if tiny else 64
    s.temperature = 1.0
    s.min_p = 0.02  # min-p, not top-p: no sort over V per step
    return s


def eval_config(tiny: bool) -> ml_collections.ConfigDict:
    e = ml_collections.ConfigDict()
    e.enabled = True
    e.sets = ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'qa', 'sum')
    e.per_set = 2 if tiny else 8  # Speed prompts per set (speed/ under data.root).
    e.data_dir = ''  # '' = <workdir>/eval_data (target-greedy responses, cached)
    e.batch_size = 16
    e.max_new_tokens = 16 if tiny else 128
    e.max_prompt_len = 256 if tiny else 1536
    e.seq_len = 512 if tiny else 2048
    e.chain = 5
    e.tree = (4, 2, 2, 1, 1)  # Children per node at each depth: 60 nodes.
    return e
