"""Distil a small draft LM from the embedded default (SmolLM2-135M-Instruct).

    python launch/train_draft.py --config configs/smollm2_135m_draft.py --workdir runs/draft
    python launch/train_draft.py --config configs/smollm2_135m_draft.py:tiny --workdir /tmp/d

Stages (each resumable in the workdir): self-distillation data (the target writes user
prompts itself, then answers them and GSM8K-train / unevaluated MBPP prompts, greedy),
distillation on response tokens (hard-label CE, optionally KL to the target's logits),
held-out acceptance on the speed prompts, export as an HF directory (bf16
safetensors + tokenizer). `:tiny` runs in about a minute on a random tiny target (a smoke
test of every stage).
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kind = 'draft_lm'
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
    return c


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
