"""The benches' speed table in the field's shape (`spec_jax.eval.speed`: SPEED-Bench's
acceptance length, per-position acceptance, TTFT and TPOT per engine), with the distortion a
lossy rule pays and its matched baseline beside it.

A bench adds the matched baseline to the engines it times (`with_matched`: the same rule with
`baseline=True`, timed interleaved with the others on the same prompts and seeds), builds one
row per engine from every timed call (`rows_of`), meters the lossy engine once, untimed, for
its TV (`metered_tv`: the timed loop does not pay the meter) and prints `speed.terminal`.
"""

from __future__ import annotations

from spec_jax import decoding, rules
from spec_jax.eval import speed
from spec_jax.sampling import Sampler

LOSSLESS = (rules.Lossless, rules.Greedy)


def is_lossy(engine: decoding.Engine) -> bool:
    """Whether a speculative engine's rule may change the target's law."""
    return engine.num_draft > 0 and not isinstance(engine.rule, LOSSLESS)


def with_matched(engines: dict[str, decoding.Engine], name: str) -> dict[str, decoding.Engine]:
    """`engines` and, when `engines[name]`'s rule is lossy, its matched baseline under
    `name + ' matched'`."""
    if not is_lossy(engines[name]):
        return engines
    return {**engines, matched_name(name): engines[name].replace(baseline=True)}


def matched_name(name: str) -> str:
    return f'{name} matched'


def kind_of(name: str, engines: dict[str, decoding.Engine]) -> str:
    """The evaluation's method kinds: 'ar', 'lossless', 'lossy' or 'baseline'."""
    engine = engines[name]
    if engine.num_draft == 0:
        return 'ar'
    if engine.baseline:
        return 'baseline'
    return 'lossy' if is_lossy(engine) else 'lossless'


def rows_of(times: dict, engines: dict[str, decoding.Engine], batch: int,
            tv: dict[str, dict] | None = None) -> list[dict]:  # fmt: skip
    """One speed row per engine from its timed calls (`bench_chain.interleaved_runs`'s
    {name: [(seconds, tokens, results) per round]}): every call's requests pooled; `tv`
    {name: `metered_tv`'s fields} for the engines metered."""
    out = []
    for name, runs in times.items():
        requests = [req for r, (_, _, results) in enumerate(runs) for k, res in
                    enumerate(results) for req in speed.requests_of_result(res, (r, k))]
        kind = kind_of(name, engines)
        row = dict(method=name, kind=kind, batch=batch,
                   pairs=[matched_name(name)] if kind == 'lossy' else [])  # fmt: skip
        row.update(speed.fields(requests, spec=kind != 'ar'))
        row.update((tv or {}).get(name) or {})
        out.append(row)
    return out


def metered_tv(engine: decoding.Engine, params, ids, temperature: float, batch: int) -> dict:
    """TV(pi, p_A) of a lossy engine over every emitted position of `ids` at `temperature`,
    in groups of `batch`, from the engine's meter, untimed (a metered loop is its own
    program); the speed fields' tv, tv_half (over requests), tv_n, tv_positions."""
    metered = engine.replace(meter_distortion=True, sampler=Sampler(temperature=temperature))
    requests = []
    for k in range(0, len(ids), batch):
        res = decoding.generate(metered, params, ids[k : k + batch], seed=1)
        requests += speed.requests_of_result(res, k)
    got = speed.fields(requests)
    return dict({key: got[key] for key in ('tv', 'tv_half', 'tv_n', 'tv_positions')},
                tv_batch=batch)


def print_table(temperature: float, batch: int, rows: list[dict]) -> None:
    """The speed table of one (temperature, batch)."""
    at = {r['tv_batch'] for r in rows if r.get('tv_batch')}
    metered = f'; TV metered untimed at batch {at.pop()}' if at else ''
    print(f'T={temperature} batch {batch}, measured (each mean ± its 95% t half-width over '
          f'requests, TTFT over calls{metered}):')  # fmt: skip
    print(speed.terminal(rows))


def fill(ids: list, batch: int) -> list:
    """`ids` cycled to a whole number of batches (at least one), so every timed call runs at
    `batch`: a sweep past the prompt count repeats prompts (each row its own sample id)."""
    n = max(-(-len(ids) // batch), 1) * batch
    return [ids[k % len(ids)] for k in range(n)]
