"""Where a round's time goes: a `jax.profiler` trace of N decode rounds after a warm-up.

The generate, evaluate and bench jobs take `profile_dir` (and `profile_rounds`): after their
work, each engine of the job (AR and the config's chain or tree) prefills one batch of the
job's prompts, runs one round to compile and warm up, then runs `profile_rounds` rounds
under `jax.profiler.trace`, each its own device call marked `<engine> round <i>` (a
`StepTraceAnnotation`: XProf's step view shows one step per round). A round here is the
engine's own round (`engine.rounds_call` on a state whose rows may commit one more token:
the drafting, the verification forward and the rule run whole; the commit keeps one token,
so the context grows by one a round). The trace is what TensorBoard's profile plugin
(XProf) reads (`plugins/profile/<run>/*.xplane.pb`) and, beside it, `perfetto_trace.json.gz`
for ui.perfetto.dev (docs/performance.md, "Profiling").
"""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp

from spec_jax import checkpoints, decoding, rules
from spec_jax.decoding import batching, drafters
from spec_jax.decoding import engine as eng
from spec_jax.decoding.state import DecodeState
from spec_jax.eval import plan, runner
from spec_jax.jobs import bench_chain

AR = plan.Method('ar', 'ar', 'lossless')


def with_ar(engine: decoding.Engine) -> dict[str, decoding.Engine]:
    """{'ar': the engine's AR, its mode: the engine} (just {'ar': it} for an AR engine)."""
    return {'ar': runner.engine_for(engine, AR), engine.mode: engine}


def profile_rounds(
    engines: dict[str, decoding.Engine],
    params: decoding.Params,
    ids: list[list[int]],
    profile_dir: str,
    rounds: int = 5,
) -> str:
    """Writes a trace of `rounds` rounds of each engine on prompts `ids` (one batch).

    Args:
      engines: name -> engine ('ar', 'chain', ...), the same target and drafter params.
      params: the target's and the drafter's weights (the drafter's unused by AR).
      ids: the prompts' token ids, one batch (each engine's compiled batch size).
      profile_dir: where the trace goes (created).
      rounds: traced rounds per engine, after one warm-up round.

    Returns:
      The folder of this trace (`<profile_dir>/plugins/profile/<run>`).

    Raises:
      ValueError: `rounds` below 1, or more rounds than an engine's output buffer holds
        (each round emits a token: `max_new_tokens` must exceed rounds + 1).
    """
    for name, engine in engines.items():
        room = engine.decode.buffer_len - 2  # The first token and the warm-up round's.
        if not 1 <= rounds <= room:
            raise ValueError(
                f'profile_rounds={rounds}: {name} holds 1..{room} rounds after warm-up '
                f'(max_new_tokens {engine.decode.max_new_tokens})'
            )
    states = {}
    for name, engine in engines.items():
        states[name] = _one_round(engine, params, _prefill(engine, params, ids))  # Compiles.
    os.makedirs(profile_dir, exist_ok=True)
    before = set(glob.glob(os.path.join(profile_dir, 'plugins', 'profile', '*')))
    with jax.profiler.trace(profile_dir, create_perfetto_trace=True):
        for name, engine in engines.items():
            for i in range(rounds):
                with jax.profiler.StepTraceAnnotation(f'{name} round', step_num=i):
                    states[name] = _one_round(engine, params, states[name])
    new = sorted(set(glob.glob(os.path.join(profile_dir, 'plugins', 'profile', '*'))) - before)
    where = new[-1] if new else profile_dir
    print(f'profile: {rounds} rounds of {", ".join(engines)} after a warm-up round, batch '
          f'{len(ids)}: {where} (TensorBoard --logdir {profile_dir}, or '
          f'perfetto_trace.json.gz at ui.perfetto.dev)')  # fmt: skip
    return where


def profile_experiment(c, profile_dir: str) -> str:
    """`profile_rounds` of an evaluation config `c`: AR and its mode's lossless engine on
    its first `batch_size` items (tasks in order), into `profile_dir`."""
    built = decoding.build(runner.decoding_block(c))
    items = [it for _, its in runner.load_items(c).values() for it in its][: c.batch_size]
    ids = [built.tokenizer.encode_chat(list(it.messages)) for it in items]
    return profile_rounds(with_ar(built.engine), built.params, ids, profile_dir, c.profile_rounds)


def profile_bench(c, profile_dir: str) -> str:
    """`profile_rounds` of a bench config that names a model: configs/bench.py (AR on a
    synthetic prompt of `ar_prompt_len` tokens, `ar_new_tokens`), configs/bench_chain.py
    (AR and its chain) or configs/bench_tree.py (AR and its tree), on the first of its
    speed prompts, a batch of the largest of `batches` (`ar_batches`)."""
    if 'sets' not in c:  # configs/bench.py: the AR bench.
        target = checkpoints.load(c.model, c.dtype, c.seed)
        batch, n = max(c.ar_batches), c.ar_prompt_len
        ids = [[(7 * i + 3 * b) % target.cfg.vocab_size for i in range(n)] for b in range(batch)]
        dec = decoding.DecodeSettings(max_new_tokens=c.ar_new_tokens, prompt_bucket=n,
                                      max_prompt_len=n)  # fmt: skip
        engine, params = decoding.Engine(target.cfg, dec), decoding.Params(target.params)
        return profile_rounds({'ar': engine}, params, ids, profile_dir, c.profile_rounds)
    target, _, ids, dec = bench_chain.speed_setup(c)
    tree = 'tree' in c
    chain = {} if tree else dict(ngram=c.ngram, lookup=c.lookup)
    built = drafters.make('eagle3' if tree else c.drafter, target, c.draft, dtype=c.dtype,
                          seed=c.seed, **chain)  # fmt: skip
    engine = decoding.Engine(target.cfg, dec, built.drafter, c.num_draft, rules.make(c.rule))
    engine = engine.replace(tree=decoding.tree_shape(c.tree)) if tree else engine
    params = decoding.Params(target.params, built.params)
    return profile_rounds(with_ar(engine), params, ids[: max(c.batches)], profile_dir,
                          c.profile_rounds)  # fmt: skip


def _prefill(engine: decoding.Engine, params: decoding.Params, ids) -> DecodeState:
    dec = engine.decode
    batch = batching.pack_prompts(ids, prompt_bucket=dec.prompt_bucket,
                                  max_prompt_len=dec.max_prompt_len)  # fmt: skip
    b = len(ids)
    return eng.prefill_call(
        engine, params.target, params.draft if engine.drafter else None,
        jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
        jnp.full((b,), dec.max_new_tokens, jnp.int32), jnp.arange(b, dtype=jnp.int32),
        jax.random.PRNGKey(0),
    )  # fmt: skip


def _one_round(engine: decoding.Engine, params: decoding.Params, s: DecodeState):
    """One round of every row (each may commit one more token, so the loop stops after
    it), blocked on: the same compiled `rounds_call` as `decoding.generate`'s."""
    s = s.replace(limit_b=s.num_out_b + 1, done_b=jnp.zeros_like(s.done_b))
    out = eng.rounds_call(engine, params.target, params.draft if engine.drafter else None, s)
    return jax.block_until_ready(out[3])
