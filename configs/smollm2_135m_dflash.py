"""Train a DFlash block drafter for the embedded default (SmolLM2-135M-Instruct).

    python launch/train_dflash.py --config configs/smollm2_135m_dflash.py --workdir runs/df
    python launch/train_dflash.py --config configs/smollm2_135m_dflash.py:tiny --workdir /tmp/d

One Qwen3-style layer over fc(concat of the target's taps [2, 15, 27]), block size 8 (the
pending token and 7 masks), the target's embeddings and lm head; trained on the target's
greedy answers to GSM8K-train prompts with their stored taps and top-16 law; exported in
the released layout (bf16 safetensors). `:tiny`: a random tiny target, seconds on CPU.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.target = 'random:tiny' if tiny else 'embedded'
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.root = ''  # '' = $SPEC_JAX_DATA, else the bundled samples (128 GSM8K-train).
    c.data.dir = ''  # '' = <workdir>/data.
    c.data.sources = ('gsm8k',)  # train.prompts.SOURCES; never the speed sets.
    c.data.num_prompts = 6 if tiny else 128  # 0 = all.
    c.data.batch_size = 3 if tiny else 16
    c.data.max_new_tokens = 12 if tiny else 128
    c.data.max_prompt_len = 512
    c.data.seed = 0
    c.data.top_k = 4 if tiny else 16  # The stored top-k teacher law.
    c.data.heldout = 2 if tiny else 16  # The last examples, held out for the eval.

    c.model = ml_collections.ConfigDict()
    c.model.num_layers = 1
    c.model.block_size = 4 if tiny else 8
    c.model.taps = () if tiny else (2, 15, 27)  # () = DFlashConfig.for_target's.

    c.train = ml_collections.ConfigDict()
    c.train.steps = 6 if tiny else 1200
    c.train.seconds = 0.0 if tiny else 720.0  # Stop early past this (0 = no limit).
    c.train.batch_size = 2 if tiny else 4
    c.train.seq_len = 64 if tiny else 384
    c.train.anchors = 4 if tiny else 8  # Blocks per row per step.
    c.train.decay = 0.0  # Position-decay length; 0 = (block_size - 1) / 2.
    c.train.lr = 3e-3
    c.train.warmup = 2 if tiny else 40
    c.train.clip = 1.0
    c.train.weight_decay = 0.0
    c.train.log_every = 2 if tiny else 25

    c.eval = ml_collections.ConfigDict()
    c.eval.enabled = True

    c.export = ml_collections.ConfigDict()
    c.export.dir = ''  # e.g. spec_jax/assets/drafts/smollm2_135m_dflash
    c.export.dtype = 'bfloat16'
    return c
