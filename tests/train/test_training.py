"""Training: a tiny EAGLE-3 head learns a tiny target; a killed run resumes bit-exactly;
resumable self-distillation data; the tiny job end to end."""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from spec_jax import checkpoints, data_files
from spec_jax.eval import acceptance
from spec_jax.models import eagle3 as e3
from spec_jax.models import llama
from spec_jax.models.config import ModelConfig
from spec_jax.train import batches, core, distill, generation, prompts, shards, teacher
from spec_jax.train import eagle3 as te

TARGET = ModelConfig.tiny(num_layers=6, vocab_size=61)
HEAD = e3.Eagle3Config.for_target(
    TARGET, draft_vocab_size=40, num_heads=4, num_kv_heads=2, head_dim=8, mlp_width=48
)
BATCH, SEQ, PROMPT = 8, 40, 8


def _greedy_texts(tp, n, seed):
    """n target-greedy sequences: random 8-token prompts + 32 greedy tokens (no cache)."""
    rng = np.random.default_rng(seed)
    toks = np.zeros((n, SEQ), np.int32)
    toks[:, :PROMPT] = rng.integers(0, TARGET.vocab_size, (n, PROMPT))
    fwd = jax.jit(lambda p, x: core.teacher_forward(TARGET, p, x, jnp.ones(x.shape, bool))[0])
    for t in range(PROMPT, SEQ):
        logits = fwd(tp, jnp.asarray(toks))
        toks[:, t] = np.asarray(jnp.argmax(logits[:, t - 1], -1))
    mask = np.zeros((n, SEQ), bool)
    mask[:, PROMPT:] = True
    return [shards.Example(toks[i], mask[i]) for i in range(n)]


@pytest.fixture(scope='module')
def world():
    # A sharper random target (larger weights): its greedy text has structure to learn.
    tp = llama.init_params(TARGET, jax.random.PRNGKey(0))
    tp = jax.tree.map(lambda x: x * 2.0 if x.ndim >= 2 else x, tp)
    train = _greedy_texts(tp, 96, 1)
    heldout = _greedy_texts(tp, 16, 2)
    counts = batches.token_counts(train, TARGET.vocab_size)
    used = e3.draft_vocab_from_counts(counts, HEAD.draft_vocab_size)
    return (
        tp,
        train,
        heldout,
        jnp.asarray(used.astype(np.int32)),
        jnp.asarray(e3.vocab_maps(used, TARGET.vocab_size)[1]),
    )


def _depth_agreement(tp, hp, ids, examples):
    b = batches.make_batch(examples, SEQ, 8)
    top = np.asarray(
        te.ttt_topk(
            TARGET, HEAD, tp, hp, ids, jnp.asarray(b.tokens_bt), jnp.asarray(b.valid_bt), 3, 1
        )
    )
    hits = acceptance.tree_hits(top, b.tokens_bt, (1, 1, 1))
    out, lengths = [], []
    for j in range(3):
        m = np.zeros_like(b.loss_mask_bt)
        m[:, PROMPT - 1 : SEQ - j - 2] = True
        out.append(hits[j][m].mean())
    for row in range(len(examples)):
        lengths += acceptance.chain_lengths(hits[:, row], PROMPT - 1, SEQ - 1, 3)
    return np.array(out), float(np.mean(lengths))


@functools.cache
def _optimizer_and_step():
    """One optimizer (a 300-step schedule) and one compiled TTT step for every test."""
    opt = core.make_optimizer(1e-2, 300, 20, 1.0)
    return opt, te.make_train_step(TARGET, HEAD, opt, steps=7)


def _eagle_setup(world):
    tp, train, _, ids, t2d = world
    opt, step = _optimizer_and_step()
    params = e3.init_params(HEAD, jax.random.PRNGKey(3))
    state = dict(params=params, opt_state=opt.init(params), step=jnp.zeros((), jnp.int32))

    def step_fn(s, b, _):
        return step(
            tp,
            ids,
            t2d,
            s,
            jnp.asarray(b.tokens_bt),
            jnp.asarray(b.loss_mask_bt),
            jnp.asarray(b.valid_bt),
        )

    def stream(start):
        return batches.batch_stream(train, BATCH, SEQ, 0, start, 8)

    return state, step_fn, stream


def test_tiny_head_learns_far_above_chance(world):
    """300 TTT steps: greedy agreement on held-out target-greedy text must exceed 0.6 at
    depth 1 and 0.5 at depth 2 (chance: 1/40 over the draft vocabulary; the untrained head
    scores < 0.1), and the chain-3 acceptance length must exceed 2.2 (1.0 = nothing
    accepted). Measured: 0.83 / 0.84 and 2.69 (untrained 0.0 / 1.0)."""
    tp, _, heldout, ids, _ = world
    state, step_fn, stream = _eagle_setup(world)
    before, len_before = _depth_agreement(tp, state['params'], ids, heldout)
    state, history = core.train_loop(
        state=state,
        step_fn=step_fn,
        batches=stream,
        steps=300,
        workdir=None,
        log_every=50,
        progress=False,
    )
    after, len_after = _depth_agreement(tp, state['params'], ids, heldout)
    print(
        'agreement before',
        before,
        len_before,
        'after',
        after,
        len_after,
        'acc0 logged',
        history[-1]['acc0'],
    )
    assert before[0] < 0.1
    assert after[0] > 0.6 and after[1] > 0.5
    assert len_after > 2.2
    assert history[-1]['loss'] < history[0]['loss']


def test_cached_step_equals_online_step(world):
    """Training on stored taps and top-k labels is the online step when nothing is dropped:
    with k = V (the whole law) and fp32 taps, one update gives the same head and metrics."""
    tp, train, _, ids, t2d = world
    opt, online = _optimizer_and_step()
    cached = te.make_cached_train_step(HEAD, opt, steps=7)
    b = batches.make_batch(train[:BATCH], SEQ, 8)
    tokens, mask, valid = (jnp.asarray(x) for x in (b.tokens_bt, b.loss_mask_bt, b.valid_bt))
    logits, taps = core.teacher_forward(TARGET, tp, tokens, valid, taps=True)
    logp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits, -1), TARGET.vocab_size)

    def fresh():
        params = e3.init_params(HEAD, jax.random.PRNGKey(3))
        return dict(params=params, opt_state=opt.init(params), step=jnp.zeros((), jnp.int32))

    a, ma = online(tp, ids, t2d, fresh(), tokens, mask, valid)
    c, mc = cached(tp['embed_vd'], ids, t2d, fresh(), tokens, mask, valid, taps, top_ids, logp)
    for key in ma:
        np.testing.assert_allclose(mc[key], ma[key], rtol=1e-4, atol=1e-6, err_msg=key)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), c['params'], a['params'])


def test_mbpp_source_leaves_out_every_evaluated_task(tmp_path):
    """MBPP+ evaluates tasks from every MBPP split: the 'mbpp' training source keeps none of
    them, and none of MBPP's test split; without the MBPP+ ids it refuses to guess."""
    with open(os.path.join(data_files.BUNDLED, 'mbppplus', 'task_ids.json')) as f:
        releases = json.load(f)
    assert [len(ids) for ids in releases.values()] == [399, 378]
    evaluated = set(range(11, 511)) | {int(t.split('/')[1]) for r in releases.values() for t in r}
    rows = prompts.mbpp_training_rows()
    assert rows and not {r['task_id'] for r in rows} & evaluated
    with open(os.path.join(data_files.BUNDLED, 'mbpp', 'sanitized-mbpp.json')) as f:
        kept = {r['task_id'] for r in json.load(f)} - evaluated
    assert {r['task_id'] for r in rows} == kept  # Nothing else is dropped.
    assert len(prompts.mbpp_train()) == len(rows)
    # A user's directory with the full MBPP+ release and no id list: ids from its rows.
    os.makedirs(tmp_path / 'mbpp')
    shutil.copy(os.path.join(data_files.BUNDLED, 'mbpp', 'sanitized-mbpp.json'), tmp_path / 'mbpp')
    os.makedirs(tmp_path / 'mbppplus')
    plus = {t for r in releases.values() for t in r} | {f'Mbpp/{i}' for i in sorted(kept)[:3]}
    with open(tmp_path / 'mbppplus' / 'MbppPlus-v0.2.0.jsonl', 'w') as f:
        f.writelines(json.dumps({'task_id': t}) + '\n' for t in sorted(plus))
    assert len(prompts.mbpp_training_rows(str(tmp_path))) == len(rows) - 3
    os.remove(tmp_path / 'mbppplus' / 'MbppPlus-v0.2.0.jsonl')
    with pytest.raises(data_files.DataFileError, match=r"no MBPP\+ task ids .* drop 'mbpp'"):
        prompts.mbpp_train(str(tmp_path))


def test_missing_training_data_names_the_file_the_field_and_the_hub(tmp_path, monkeypatch):
    """An empty data root: every built-in source fails with the file it wanted, the config
    field and environment variable that choose the root, and where the full data lives."""
    monkeypatch.delenv(data_files.ENV_VAR, raising=False)
    hub = {'gsm8k': 'openai/gsm8k', 'mbpp': 'google-research-datasets/mbpp',
           'bfcl': 'bfcl-eval'}
    for name, wanted in prompts.SOURCE_FILES.items():
        with pytest.raises(data_files.DataFileError) as e:
            prompts.training_prompts((name,), seed=0, root=str(tmp_path))
        message = str(e.value)
        assert wanted[0] in message and hub[name] in message, message
        assert f'data.root={str(tmp_path)!r}' in message and data_files.ENV_VAR in message
    monkeypatch.setenv(data_files.ENV_VAR, str(tmp_path))  # The variable as the fallback.
    with pytest.raises(data_files.DataFileError, match=r'\$SPEC_JAX_DATA=.*data.root unset'):
        prompts.gsm8k_train()
    monkeypatch.delenv(data_files.ENV_VAR)
    assert data_files.data_root() == data_files.BUNDLED and prompts.gsm8k_train()


def test_ttt_loss_by_hand():
    """The TTT loss against loops: step j at t is scored on the teacher at t + j + 1, weighted
    0.8**j, averaged over response positions whose target top-1 is in the draft vocabulary;
    acc_j counts every response position."""
    rng = np.random.default_rng(0)
    steps, b, t, u, v = 3, 2, 11, 5, 13
    logits = rng.normal(size=(steps, b, t, u)).astype(np.float32)
    p = rng.dirichlet(np.ones(u), size=(b, t)).astype(np.float32)
    draft_ids = np.array([0, 2, 3, 7, 11])
    top = rng.choice([0, 2, 3, 7, 11, 1, 5], size=(b, t))  # 1 and 5 are not in the draft vocab
    top[0, 4] = 3  # step 0 at t = 3 scores the teacher at t = 4: make the draft right there
    logits[0, 0, 3, 2] = 9.0
    t2d = np.isin(np.arange(v), draft_ids)
    loss_mask = rng.random((b, t)) < 0.7
    valid = np.ones((b, t), bool)
    valid[1, -2:] = False
    teacher_law = (jnp.asarray(p), jnp.asarray(top))
    loss, acc = te.ttt_loss(
        jnp.asarray(logits),
        teacher_law,
        *(jnp.asarray(x) for x in (loss_mask, valid, draft_ids, t2d)),
    )
    want_loss, want_acc = 0.0, []
    logq = np.asarray(jax.nn.log_softmax(logits, -1))
    for j in range(steps):
        ce, hits, n_loss, n_acc = 0.0, 0, 0, 0
        for r in range(b):
            for i in range(t - j - 1):
                at = i + j + 1
                if not (loss_mask[r, at] and valid[r, at]):
                    continue
                n_acc += 1
                hits += draft_ids[logits[j, r, i].argmax()] == top[r, at]
                if t2d[top[r, at]]:
                    n_loss += 1
                    ce -= (p[r, at] * logq[j, r, i]).sum()
        want_loss += 0.8**j * ce / n_loss
        want_acc.append(hits / n_acc)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
    assert want_acc[0] > 0


def test_resume_matches_uninterrupted(world, tmp_path):
    """Kill after 7 steps (last checkpoint at 4), resume to 12 == 12 uninterrupted steps."""
    state, step_fn, stream = _eagle_setup(world)
    init = jax.tree.map(np.array, state)
    full, _ = core.train_loop(
        state=jax.tree.map(jnp.asarray, init),
        step_fn=step_fn,
        batches=stream,
        steps=12,
        workdir=str(tmp_path / 'a'),
        checkpoint_every=4,
        progress=False,
    )
    crashed, _ = core.train_loop(
        state=jax.tree.map(jnp.asarray, init),
        step_fn=step_fn,
        batches=stream,
        steps=12,
        workdir=str(tmp_path / 'b'),
        checkpoint_every=4,
        stop_after=7,
        progress=False,
    )
    assert int(crashed['step']) == 7
    starts = []  # Where the resumed run asks the data to start: its checkpoint's step.

    def recorded(start):
        starts.append(start)
        return stream(start)

    resumed, _ = core.train_loop(
        state=jax.tree.map(jnp.asarray, init),
        step_fn=step_fn,
        batches=recorded,
        steps=12,
        workdir=str(tmp_path / 'b'),
        checkpoint_every=4,
        progress=False,
    )
    assert int(resumed['step']) == 12 and starts == [4]  # Resumed, not restarted.
    for a, b in zip(
        jax.tree.leaves(full['params']), jax.tree.leaves(resumed['params']), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_batch_stream_is_a_function_of_the_step(world):
    _, train, _, _, _ = world
    a = batches.batch_stream(train, 8, SEQ, 5, 0, 8)
    seq = [next(a).tokens_bt for _ in range(15)]
    b = batches.batch_stream(train, 8, SEQ, 5, 9, 8)
    for s in range(9, 15):
        np.testing.assert_array_equal(next(b).tokens_bt, seq[s])


def test_draft_lm_kl_step_learns(world):
    tp, train, _, _, _ = world
    dcfg = distill.draft_config(
        TARGET, width=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_width=48
    )
    params = distill.init_draft(dcfg, tp, jax.random.PRNGKey(0))
    opt = core.make_optimizer(1e-2, 60, 5)
    step = distill.make_train_step(TARGET, dcfg, opt)
    state = dict(params=params, opt_state=opt.init(params), step=jnp.zeros((), jnp.int32))
    losses = []
    for b in batches.batch_stream(train, 8, SEQ, 0, 0, 8):
        state, m = step(
            tp,
            state,
            jnp.asarray(b.tokens_bt),
            jnp.asarray(b.loss_mask_bt),
            jnp.asarray(b.valid_bt),
        )
        losses.append(float(m['loss']))
        if len(losses) == 60:
            break
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:5])


def test_topk_loss_with_every_token_is_kl_plus_entropy():
    """With k = V stored, the soft-label loss is the KL step's loss plus the teacher's
    entropy (a constant), so both train the same thing; fewer ids renormalise."""
    rng = np.random.default_rng(0)
    teacher_logits = jnp.asarray(rng.normal(size=(2, 5, 11)) * 2, jnp.float32)
    student = jnp.asarray(rng.normal(size=(2, 5, 11)), jnp.float32)
    mask = jnp.asarray(rng.random((2, 5)) < 0.7)
    lp, ids = jax.lax.top_k(jax.nn.log_softmax(teacher_logits), 11)
    soft, agree = distill.topk_loss(lp, ids, student, mask)
    kl, kl_agree = distill.kl_loss(teacher_logits, student, mask)
    p = jax.nn.softmax(teacher_logits)
    entropy = -(p * jnp.log(p)).sum(-1)
    m = mask.astype(jnp.float32)
    np.testing.assert_allclose(soft, kl + (entropy * m).sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(agree, kl_agree)
    # k = 1 is hard-label cross-entropy on the teacher's argmax.
    hard, _ = distill.topk_loss(lp[..., :1], ids[..., :1], student, mask)
    ce = optax.softmax_cross_entropy_with_integer_labels(student, jnp.argmax(teacher_logits, -1))
    np.testing.assert_allclose(hard, (ce * m).sum() / m.sum(), rtol=1e-5)


def test_projected_embedding_keeps_geometry():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(50, 6)) @ rng.normal(size=(6, 20))  # rank 6
    p = distill.projected_embedding(e, 6)
    # Rank-6 data: the projection keeps every pairwise inner product (up to the mean shift).
    ec, pc = e - e.mean(0), p - p.mean(0)
    scale = (ec**2).sum() / (pc**2).sum()
    np.testing.assert_allclose(pc @ pc.T * scale, ec @ ec.T, rtol=1e-4, atol=1e-3)


def test_data_generation_resumes_without_redoing_work(tmp_path):
    """Shards are written atomically and skipped on rerun; a lost shard is regenerated
    identically (greedy, fixed order)."""

    model = checkpoints.load('random:tiny')
    chosen = prompts.training_prompts(('gsm8k', 'mbpp'), seed=0)[:6]
    kw = dict(batch_size=3, max_new_tokens=4, max_prompt_len=512, progress=False)
    first = generation.generate_dataset(model, chosen, str(tmp_path), **kw)
    assert first['shards_written'] == 2 and shards.finished_shards(str(tmp_path)) == {0, 1}
    examples = shards.read_examples(str(tmp_path))
    assert len(examples) == 6
    # Each example is one prompt's chat ids (batches group prompts by length) followed by
    # its response (at most 4 new tokens), and only the response is masked in.
    unused = [model.tokenizer.encode_chat(list(p.messages)) for p in chosen]
    for e in examples:
        (ids,) = [x for x in unused if list(e.tokens[: len(x)]) == x]
        unused.remove(ids)
        assert len(e.tokens) - len(ids) in range(1, kw['max_new_tokens'] + 1)
        np.testing.assert_array_equal(e.loss_mask, np.arange(len(e.tokens)) >= len(ids))
    kept = os.path.getmtime(shards.shard_path(str(tmp_path), 0))
    lost = shards.read_shard(shards.shard_path(str(tmp_path), 1))
    os.remove(shards.shard_path(str(tmp_path), 1))  # a crash before shard 1 was finished
    again = generation.generate_dataset(model, chosen, str(tmp_path), **kw)
    assert again['shards_written'] == 1
    assert os.path.getmtime(shards.shard_path(str(tmp_path), 0)) == kept
    for a, b in zip(lost, shards.read_shard(shards.shard_path(str(tmp_path), 1)), strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
    assert generation.generate_dataset(model, chosen, str(tmp_path), **kw)['shards_written'] == 0
    _check_teacher_topk(model, str(tmp_path))
    # The same directory with other prompts or fewer batches: stale shards, refused.
    other = prompts.training_prompts(('gsm8k', 'mbpp'), seed=1)[:6]
    with pytest.raises(ValueError, match='shard_00000.npz does not hold the prompts of batch 0'):
        generation.generate_dataset(model, other, str(tmp_path), **kw)
    with pytest.raises(ValueError, match='shard_00001.npz exists, but these prompts make only 1'):
        generation.generate_dataset(model, chosen[:3], str(tmp_path), **kw)


def test_unknown_data_source_names_the_builtin_ones():
    with pytest.raises(ValueError, match=r"'no_such_set' is none of the built-in sources"):
        prompts.training_prompts(('gsm8k', 'no_such_set'), seed=0)


def _check_teacher_topk(model, directory):
    """Soft labels line up with their tokens: on target-greedy text the teacher's top-1 at
    every response prediction position IS the next token; a rerun skips finished shards."""
    top3 = shards.topk_name(3)
    with pytest.raises(ValueError, match='run teacher_topk'):
        shards.read_examples(directory, [top3])
    compiled = core.teacher_topk_logprobs._cache_size()
    first = teacher.teacher_topk(model, directory, 3, batch_size=2, bucket=1024, progress=False)
    assert first['shards_written'] == 2
    # Lengths are padded to the bucket: one shape per batch size (2, and 1 for the rest).
    assert core.teacher_topk_logprobs._cache_size() - compiled <= 2
    examples = shards.read_examples(directory, [top3])
    for e in examples:
        ids, logprobs = e.labels['topk_ids'], e.labels['topk_logprobs']
        assert ids.shape == logprobs.shape == (len(e.tokens), 3)
        assert ids.dtype == np.int32
        predicts_response = e.loss_mask[1:]
        np.testing.assert_array_equal(
            ids[:-1, 0][predicts_response], e.tokens[1:][predicts_response]
        )
        assert (np.diff(logprobs.astype(np.float32), axis=1) <= 0).all()
    kept = os.path.getmtime(shards.sidecar_path(directory, top3, 0))
    assert teacher.teacher_topk(model, directory, 3, progress=False)['shards_written'] == 0
    assert os.path.getmtime(shards.sidecar_path(directory, top3, 0)) == kept
    b = batches.make_batch(examples[:3], 16, 8)  # Padded like the tokens; pads weigh nothing.
    assert b.labels['topk_ids'].shape == (*b.tokens_bt.shape, 3)
    assert (b.labels['topk_logprobs'][~b.valid_bt] == -1e9).all()
    np.testing.assert_array_equal(
        b.labels['topk_ids'][0, : len(examples[0].tokens[-16:])],
        examples[0].labels['topk_ids'][-16:],
    )
    # Feature taps: each example's stored taps are the target's on that example alone.
    taps = model.cfg.hf_taps()
    assert teacher.teacher_taps(model, directory, taps, progress=False)['shards_written'] == 2
    both = shards.read_examples(directory, [top3, shards.taps_name(taps)])
    for e in both[:2]:
        assert set(e.labels) == {'topk_ids', 'topk_logprobs', 'taps'}
        tokens = jnp.asarray(e.tokens)[None]
        _, want = core.teacher_forward(
            model.cfg, model.params, tokens, jnp.ones(tokens.shape, bool), taps=True
        )
        assert e.labels['taps'].dtype == np.float16
        np.testing.assert_allclose(e.labels['taps'], want[0], rtol=2e-3, atol=2e-3)


def test_self_instruct_prompts_are_user_turns_and_resume(embedded, tmp_path):
    """The target writes user messages after its own user header (Magpie); only finished
    messages are kept; batch files are reused on rerun and a lost one is regenerated
    identically (seeded)."""
    kw = dict(batch_size=4, max_tokens=40, seed=3, progress=False)
    first = generation.self_instruct_prompts(embedded, 8, str(tmp_path), **kw)
    paths = [os.path.join(tmp_path, f'prompts_{k:05d}.json') for k in (0, 1)]
    assert all(os.path.exists(p) for p in paths)
    assert len(first) >= 1  # sampled at T=1: not every message finishes within 40 tokens
    for p in first:
        assert p.source == prompts.SELF_INSTRUCT
        (turn,) = p.messages
        assert turn['role'] == 'user' and turn['content'].strip()
        assert '<|im_start|>' not in turn['content'] and '<|im_end|>' not in turn['content']
    kept = os.path.getmtime(paths[0])
    os.remove(paths[1])
    again = generation.self_instruct_prompts(embedded, 8, str(tmp_path), **kw)
    assert again == first and os.path.getmtime(paths[0]) == kept
    # The prompts slot into the interleaved training order like any other source.
    mixed = prompts.training_prompts(
        (prompts.SELF_INSTRUCT, 'mbpp'), seed=0, generated={prompts.SELF_INSTRUCT: first}
    )
    assert mixed[0].source == prompts.SELF_INSTRUCT and mixed[1].source == 'mbpp'
    with pytest.raises(ValueError, match='self_instruct_prompts'):
        prompts.training_prompts((prompts.SELF_INSTRUCT,), seed=0)


def test_summarize_prompts_wrap_stored_responses(embedded, tmp_path):
    """Each stored response long enough becomes one "summarize" user turn holding its text
    (stop tokens dropped); short ones are skipped; the template choice is seeded."""
    tok = embedded.tokenizer
    prompt = tok.encode('Tell me about rivers.')
    long_text = 'Rivers carry water from the mountains to the sea, shaping valleys on the way.'
    responses = [tok.encode(long_text) + [tok.stop_ids[0]], tok.encode('Yes.')]
    examples = [
        shards.Example(np.array(prompt + r, np.int32), np.arange(len(prompt + r)) >= len(prompt))
        for r in responses
    ]
    shards.write_shard(str(tmp_path), 0, examples, {})
    made = prompts.summarize_prompts(tok, [str(tmp_path)], seed=0, min_tokens=8)
    (p,) = made
    assert p.source == prompts.SUMMARIZE
    (turn,) = p.messages
    assert turn['role'] == 'user'
    assert turn['content'] in [t.format(long_text) for t in prompts.SUMMARIZE_TEMPLATES]
    assert prompts.summarize_prompts(tok, [str(tmp_path)], seed=0, min_tokens=8) == made
    with pytest.raises(ValueError, match='no finished shards'):
        prompts.summarize_prompts(tok, [str(tmp_path / 'empty')], seed=0)
    with pytest.raises(ValueError, match='summarize_prompts'):
        prompts.training_prompts((prompts.SUMMARIZE,), seed=0)
