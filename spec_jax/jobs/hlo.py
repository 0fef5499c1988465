"""Reading an optimized HLO module's text (`compiled.as_text()`): the collectives the
decode loop's body runs per iteration, a round's (spec_jax/jobs/aot.py prints them). The
decode loop is the ENTRY's while loop without a known trip count (`decode_loop_body`): the
prefill's query-block loops and layer scans are while loops too, run once per call.

A collective is an instruction whose opcode is one of `COLLECTIVES` (or its async
`-start` form; the `-done` half is not counted again). Its bytes are those of the array it
produces on one device: the gathered output of an all-gather, the reduced array of an
all-reduce, the scattered shard of a reduce-scatter, the moved array of a
collective-permute or all-to-all. The body's computations are followed transitively
(fusions, calls, both branches of a conditional, nested loops): a conditional's branches are
all counted (an upper bound: one runs), a nested loop's body once per its known trip count
(XLA's `known_trip_count`), else once.
"""

from __future__ import annotations

import collections
import math
import re

COLLECTIVES = (
    'all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all', 'collective-permute',
    'collective-broadcast', 'ragged-all-to-all',
)  # fmt: skip
_DTYPE_BYTES = {
    'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4, 'u32': 4,
    'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16, 'f8e4m3fn': 1, 'f8e5m2': 1,
    's4': 1, 'u4': 1,
}  # fmt: skip
_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$')
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s([a-z][a-z0-9\-]*)\((.*)$')
_ARRAY = re.compile(r'\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]')
_CALLED = re.compile(
    r'\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)'
)
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


def computations(text: str) -> tuple[dict[str, list[tuple[str, str, str]]], str]:
    """{computation name: [(instruction name, result type, opcode + rest)]} of an HLO
    module's text, and the ENTRY computation's name."""
    comps: dict[str, list] = {}
    entry, current = '', None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(' '):
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
            continue
        if line.strip() == '}':
            current = None
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            comps[current].append((m.group(1), m.group(2), m.group(3) + '(' + m.group(4)))
    return comps, entry


def array_bytes(shape: str, largest: bool = False) -> int:
    """Bytes of an HLO result type: the sum over its arrays (a tuple's elements), or the
    largest of them."""
    sizes = [
        math.prod(int(d) for d in dims.split(',') if d) * _DTYPE_BYTES.get(dtype, 4)
        for dtype, dims in _ARRAY.findall(shape)
        if dtype in _DTYPE_BYTES
    ]
    if not sizes:
        return 0
    return max(sizes) if largest else sum(sizes)


def while_bodies(text: str) -> list[str]:
    """Names of the body computations of the ENTRY computation's while loops."""
    return [body for body, _ in _entry_loops(text)]


def decode_loop_body(text: str) -> str | None:
    """The body of the decode loop among the ENTRY computation's while loops: the one whose
    trip count XLA does not know (it runs until every row is done; the prefill's query-block
    `lax.map` and a layer scan have known trip counts), the largest by the instructions it
    runs where several qualify (or none does); None without a loop."""
    loops = _entry_loops(text)
    if not loops:
        return None
    comps, _ = computations(text)
    unknown = [body for body, trip in loops if trip is None]
    return max(unknown or [body for body, _ in loops], key=lambda b: _size(comps, b, ()))


def _entry_loops(text: str) -> list[tuple[str, int | None]]:
    """(body, known trip count or None) of each of the ENTRY computation's while loops."""
    comps, entry = computations(text)
    out = []
    for _, _, rest in comps.get(entry, []):
        if rest.startswith('while('):
            m = re.search(r'\bbody=%?([\w.\-]+)', rest)
            trip = _TRIP.search(rest)
            if m:
                out.append((m.group(1), int(trip.group(1)) if trip else None))
    return out


def _size(comps: dict, name: str, stack: tuple) -> int:
    """Instructions of computation `name` and of every computation it calls (once each)."""
    if name in stack or name not in comps:
        return 0
    total = 0
    for _, _, rest in comps[name]:
        total += 1 + sum(_size(comps, c, stack + (name,)) for c in _callees(rest))
    return total


def _callees(rest: str) -> list[str]:
    """The computations an instruction calls (bodies, fusions, both branches, ...)."""
    called = _CALLED.findall(rest)
    branches = _BRANCHES.search(rest)
    if branches:
        called += [b.strip().lstrip('%') for b in branches.group(1).split(',')]
    return called


def collectives(text: str, root: str) -> dict[str, dict]:
    """{kind: {'count', 'bytes'}} of the collectives computation `root` runs once, followed
    into every computation it calls (module docstring)."""
    comps, _ = computations(text)
    totals: dict[str, dict] = collections.defaultdict(lambda: dict(count=0, bytes=0))

    def visit(name: str, times: int, stack: tuple) -> None:
        if name in stack or name not in comps:
            return
        for _, shape, rest in comps[name]:
            op = rest.split('(', 1)[0]
            kind = op[: -len('-start')] if op.endswith('-start') else op
            if kind in COLLECTIVES:
                # An async start's result is (operands, outputs[, contexts]): the output.
                gathered = op.endswith('-start') and kind != 'all-reduce'
                totals[kind]['count'] += times
                totals[kind]['bytes'] += times * array_bytes(shape, largest=gathered)
            trip = _TRIP.search(rest)
            for callee in _callees(rest):
                nested = times * (int(trip.group(1)) if trip and op == 'while' else 1)
                visit(callee, nested, stack + (name,))

    visit(root, 1, ())
    return dict(totals)


def loop_collectives(text: str) -> dict[str, dict]:
    """The collectives of one round: one iteration of the decode loop's body
    (`decode_loop_body`; the prefill's loops before it are not a round's); {} without a
    loop."""
    body = decode_loop_body(text)
    return collectives(text, body) if body else {}
