"""A drafter's acceptance measured on held-out prompts, written beside it: the adaptive prior.

An adaptive engine starts from `spec.adaptive.prior`, an acceptance assumed before it has
seen a round; with `prior_from='drafter'` it reads what this bench wrote instead, per depth
(decoding/drafters/measured.py). Per prompt-lookup setting of `c.lookups`, the chain engine
at a fixed draft length `c.chain` (every depth examined whenever the one above it accepts)
decodes `c.prompts_per_set` speed-set prompts of each of `c.sets`, from prompt `c.start` on
(0-based): held out from the shipped drafters' training, from the adaptive bench's prompts
(the first 2 of each set) and from the drafters' cards' teacher-forced figures (the first
4), under the lossless rule at `c.temperature`, in batches of `c.batch`. Recorded per
setting: the accepted and reached counts at each draft position summed over the rows
(`Result.stats['per_row']`), depth_1 = accepted / reached at position 1, and the same per
set (the spread between sets, with no interval: rounds of one row are not independent
draws). Written to `c.out` ('' the drafter's directory, as `measured.FILE`) with the
config, commit, jax version and machine; printed per setting.

    python launch/bench.py --config configs/bench_prior.py          # the shipped draft LM
    python launch/bench.py --config configs/bench_prior.py:eagle3   # the shipped head
"""

from __future__ import annotations

import datetime
import json
import os

import jax
import ml_collections
import numpy as np

from spec_jax import checkpoints, data_files, decoding, rules
from spec_jax.decoding import drafters
from spec_jax.decoding.drafters import measured
from spec_jax.eval import machine
from spec_jax.sampling import Sampler


def held_out(c: ml_collections.ConfigDict, tok) -> list[tuple[str, list[int]]]:
    """(set, chat ids) of `c.prompts_per_set` prompts of each set of `c.sets` from prompt
    `c.start` on (ValueError where a set has fewer)."""
    data_files.require(data_files.speed_files(c.sets), c.data_root, 'data_root')
    end = c.start + c.prompts_per_set
    prompts = data_files.speed_prompts(c.sets, end, c.data_root, 'data_root')
    out = []
    for name in c.sets:
        rows = [text for set_name, text in prompts if set_name == name]
        if len(rows) < end:
            raise ValueError(f'bench prior: speed set {name!r} has {len(rows)} prompts; '
                             f'start={c.start} + prompts_per_set={c.prompts_per_set} needs '
                             f'{end} (a smaller start or count, or the full sets: data_root)')
        out += [(name, tok.encode_chat([{'role': 'user', 'content': t}])) for t in rows[c.start:]]
    return out


def counts(results, names: list[str]) -> dict:
    """The counts per draft position over every row of `results` (in the order of `names`,
    the rows' sets): {'all': (accepted [A], reached [A]), 'by_set': {set: (accepted,
    reached)}}."""
    per_row = [r.stats['per_row'] for r in results]
    acc = np.concatenate([np.asarray(p['accepted_at_position'], np.int64) for p in per_row])
    seen = np.concatenate([np.asarray(p['reached_at_position'], np.int64) for p in per_row])
    of = np.asarray(names)
    by_set = {n: (acc[of == n].sum(0), seen[of == n].sum(0)) for n in dict.fromkeys(names)}
    return dict(all=(acc.sum(0), seen.sum(0)), by_set=by_set)


def record(acc, seen) -> dict:
    """A lookup setting's record: counts per position and the depth-1 rate."""
    return dict(depth_1=float(acc[0] / max(seen[0], 1)), accepted_at_position=acc.tolist(),
                reached_at_position=seen.tolist())  # fmt: skip


def measure(c: ml_collections.ConfigDict, target, prompts, lookup: int) -> dict:
    """One lookup setting's record over `prompts` [(set, ids)]."""
    made = drafters.make(c.drafter, target, c.draft, ngram=c.ngram, lookup=lookup,
                         dtype=c.dtype, seed=c.seed)  # fmt: skip
    dec = decoding.DecodeSettings(max_new_tokens=c.max_new_tokens,
                                  stop_tokens=target.tokenizer.stop_ids,
                                  max_prompt_len=c.max_prompt_len,
                                  prompt_bucket=c.prompt_bucket)  # fmt: skip
    engine = decoding.Engine(target.cfg, dec, made.drafter, c.chain, rules.make('lossless'),
                             sampler=Sampler(temperature=c.temperature))  # fmt: skip
    params = decoding.Params(target.params, made.params)
    results = []
    for i in range(0, len(prompts), c.batch):
        group = [ids for _, ids in prompts[i : i + c.batch]]
        results.append(decoding.generate(engine, params, group, seed=c.seed + i))
    found = counts(results, [name for name, _ in prompts])
    out = record(*found['all'])
    out['by_set'] = {n: record(*v)['depth_1'] for n, v in found['by_set'].items()}
    return out


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Measures and writes the drafter's acceptance record (configs/bench_prior.py)."""
    if c.drafter not in ('lm', 'eagle3', 'dflash'):
        raise ValueError(f"bench prior: drafter {c.drafter!r}; give 'lm', 'eagle3' or 'dflash' "
                         '(a drafter with a directory to write beside)')
    out = c.out or os.path.join(c.draft, measured.FILE)
    if not c.out and not os.path.isdir(c.draft):
        raise ValueError(f'bench prior: draft {c.draft!r} is no directory; set out= to a path')
    target = checkpoints.load(c.model, c.dtype, c.seed)
    prompts = held_out(c, target.tokenizer)
    print(f'{len(prompts)} held-out prompts ({c.prompts_per_set} of each of {", ".join(c.sets)} '
          f'from prompt {c.start + 1}); chain of {c.chain}, lossless, T {c.temperature}, '
          f'{c.max_new_tokens} new tokens, batch {c.batch}')  # fmt: skip
    by_lookup = {}
    for lookup in c.lookups:
        rec = by_lookup[str(int(lookup))] = measure(c, target, prompts, int(lookup))
        spread = ', '.join(f'{n} {v:.3f}' for n, v in rec['by_set'].items())
        acc, seen = (np.asarray(rec[k]) for k in ('accepted_at_position', 'reached_at_position'))
        deeper = ', '.join(f'{a / max(s, 1):.3f}' for a, s in zip(acc, seen))
        print(f'lookup {lookup}: depth-1 acceptance {rec["depth_1"]:.3f} (measured: {acc[0]} '
              f'of {seen[0]} rounds; per set {spread}; no interval); conditional acceptance '
              f'by position {deeper}', flush=True)  # fmt: skip
    card = dict(
        kind=c.drafter, target=c.model, draft=os.path.basename(os.path.normpath(c.draft)),
        measured=dict(sets=list(c.sets), start=int(c.start), prompts=len(prompts),
                      prompts_per_set=int(c.prompts_per_set), chain=int(c.chain),
                      rule='lossless', temperature=float(c.temperature),
                      new_tokens=int(c.max_new_tokens), batch=int(c.batch), dtype=c.dtype,
                      ngram=int(c.ngram)),
        by_lookup=by_lookup, commit=machine.commit(), jax=jax.__version__,
        machine=machine.cpu_model() if jax.default_backend() == 'cpu'
        else jax.devices()[0].device_kind,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    )  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(card, f, indent=1)
        f.write('\n')
    print(f'wrote {out}')
    return dict(out=out, **card)
