"""Code verdicts decided where the sample cannot reach (issue 30, point 5): a fixed stratified
subset of the bundled HumanEval, MBPP and MBPP+ items (references pass beside two busy loops,
one-operator mutants fail, the same verdicts as the old in-box harness), forgeries that fail,
timeouts, and the full sweep over every bundled item (`-m sweep`)."""

import concurrent.futures
import dataclasses
import gzip
import json
import subprocess
import sys
import time

import pytest
from code_mutants import mutants

from spec_jax import data_files
from spec_jax.eval import sandbox
from spec_jax.eval.tasks import code
from spec_jax.eval.tasks.code import boxes, legacy

WORKERS = 3

# The subset: every 8th HumanEval item (the first 20), every 2nd bundled MBPP test item, all
# 10 bundled MBPP+ items; for each, the indices (into `mutants(reference)`) of its first three
# mutants that the old in-box harness fails (fewer where the reference has fewer: the rest
# are equivalent, e.g. HumanEval/16's `len(set(s.lower()))` under `lower`).
SUBSET = {
    'HumanEval/0': [0, 1, 2], 'HumanEval/8': [0, 1, 2], 'HumanEval/16': [0, 1],
    'HumanEval/24': [0, 1, 2], 'HumanEval/32': [0, 2, 5], 'HumanEval/40': [0, 1, 2],
    'HumanEval/48': [0, 1, 2], 'HumanEval/56': [0, 1, 2], 'HumanEval/64': [0, 1, 2],
    'HumanEval/72': [0, 1, 3], 'HumanEval/80': [0, 1, 2], 'HumanEval/88': [0, 1, 2],
    'HumanEval/96': [0, 1, 2], 'HumanEval/104': [0, 1, 2], 'HumanEval/112': [0, 1, 2],
    'HumanEval/120': [0, 1, 2], 'HumanEval/128': [0, 1, 2], 'HumanEval/136': [0, 1, 2],
    'HumanEval/144': [0, 1, 2], 'HumanEval/152': [1],
    '11': [0, 1, 2], '14': [0, 1, 2], '17': [0, 1], '19': [0, 1, 2], '56': [0, 1, 2],
    '58': [0, 1], '61': [0, 1, 2], '63': [0, 1, 2], '65': [0, 1, 2], '67': [0, 1, 2],
    'Mbpp/59': [0, 1, 2], 'Mbpp/80': [0, 1, 2], 'Mbpp/89': [0, 1], 'Mbpp/269': [0],
    'Mbpp/389': [0, 1, 2], 'Mbpp/420': [0, 1, 2], 'Mbpp/455': [0, 1, 2],
    'Mbpp/583': [0, 2, 3], 'Mbpp/762': [0, 1, 2], 'Mbpp/793': [0, 1, 2],
}  # fmt: skip
MUTANT_TIMEOUT_S = 1.5  # Some mutants loop forever: a short limit keeps the test fast.
TASKS = {'humaneval': code.HumanEval(), 'mbpp': code.MBPP(), 'mbppplus': code.MBPPPlus()}


def subset_items():
    he, mb, mp = (TASKS[k].load() for k in ('humaneval', 'mbpp', 'mbppplus'))
    items = he[::8][:20] + mb[::2] + mp
    assert [item.id for item in items] == list(SUBSET)
    return items


def score_all(pairs, timeout_s=None):
    tasks = dict(TASKS)
    if timeout_s:
        tasks = {k: dataclasses.replace(t, timeout_s=timeout_s) for k, t in tasks.items()}
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda p: tasks[p[0].task].score(*p), pairs))


def legacy_all(pairs, timeout_s=20.0):
    expected = {}
    for item, _ in pairs:
        if item.task == 'mbppplus' and item.id not in expected:
            expected[item.id] = legacy.legacy_expected(item)

    def one(pair):
        item, text = pair
        return legacy.passes(item, text, timeout_s, expected_b64=expected.get(item.id, ''))

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(one, pairs))


@pytest.fixture
def busy_loops():
    """Two processes spinning beside the scorer for the test's duration."""
    procs = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def test_subset_references_pass_beside_two_busy_loops(busy_loops):
    items = subset_items()
    scores = score_all([(item, item.meta['reference']) for item in items])
    failing = [(i.id, s.detail) for i, s in zip(items, scores) if not s.correct]
    assert failing == [], 'references that fail'
    assert all(s.detail['status'] == 'ok' and s.detail['calls'] > 0 for s in scores)


def test_subset_mutants_fail_as_in_the_in_box_harness():
    items = {item.id: item for item in subset_items()}
    pairs = [(items[i], mutants(items[i].meta['reference'])[k]) for i, ks in SUBSET.items()
             for k in ks]  # fmt: skip
    assert len(pairs) >= 100
    scores = score_all(pairs, timeout_s=MUTANT_TIMEOUT_S)
    passing = [(item.id, text) for (item, text), s in zip(pairs, scores) if s.correct]
    assert passing == [], 'mutants that pass'
    # A wrong answer, not the machinery (MBPP+ runs every input: status 'ok', a check False).
    assert all(s.detail['status'] in ('ok', 'failed', 'timeout') for s in scores)
    # The old one-process harness gives the same verdicts on the same programs (on the
    # references too: the sweep, and the old tests these replace).
    assert legacy_all(pairs, MUTANT_TIMEOUT_S) == [False] * len(pairs)


# --------------------------------------------------------------------------- forgeries


def he0():
    return TASKS['humaneval'].load(limit=1)[0]


WRONG = 'def has_close_elements(numbers, threshold):\n    return False\n'
FORGERIES = {
    # The old harness's end-of-tests sentinel, read from the command line, then exit 0.
    'sentinel': WRONG
    + (
        'import os, re\n'
        "argv = open('/proc/self/cmdline', 'rb').read().decode(errors='replace')\n"
        'token = re.search(r"token=\'([0-9a-f]+)\'", argv)\n'
        "fd = re.search(r'fd=([0-9]+)', argv)\n"
        'if token and fd:\n'
        "    os.write(int(fd.group(1)), f'{token.group(1)} {os.getpid()}\\n'.encode())\n"
        'os._exit(0)\n'
    ),
    'atexit': WRONG + 'import atexit, os\natexit.register(lambda: os._exit(0))\n',
    'always_equal': (
        'class Yes:\n    def __eq__(self, other):\n        return True\n'
        '    __hash__ = object.__hash__\n'
        'def has_close_elements(numbers, threshold):\n    return Yes()\n'
    ),
    'true_subclass': (
        'class Yes(int):\n    def __eq__(self, other):\n        return True\n'
        'def has_close_elements(numbers, threshold):\n    return Yes(0)\n'
    ),
    'frame_globals': (
        'import sys\n'
        'def has_close_elements(numbers, threshold):\n'
        '    f = sys._getframe(1)\n'
        '    while f is not None:\n'
        "        f.f_globals['check'] = lambda c: None\n"
        "        f.f_globals['match'] = lambda *a: True\n"
        '        f = f.f_back\n'
        '    return False\n'
    ),
    'exit_in_call': 'def has_close_elements(numbers, threshold):\n    raise SystemExit(0)\n',
    'exit_at_load': WRONG + 'raise SystemExit(0)\n',
    'os_exit_in_call': (
        'import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n'
    ),
    'deep_answer': (
        'def has_close_elements(numbers, threshold):\n'
        '    x = True\n    for _ in range(10000):\n        x = [x]\n    return x\n'
    ),
    'huge_answer': (
        'def has_close_elements(numbers, threshold):\n    return [True] * (3 * 10 ** 6)\n'
    ),
    'hostile_frame': (  # Writes its own frame of 10^6 nested lists on the answer pipe.
        'import os, sys\n'
        'def has_close_elements(numbers, threshold):\n'
        '    payload = b"l1:" * 10 ** 6 + b"T"\n'
        "    wfd = sys._getframe(1).f_locals['wfd']\n"
        '    os.write(wfd, b"%d\\n" % len(payload) + payload)\n'
        '    os._exit(0)\n'
    ),
    'pickle_frame': (  # A pickle on the answer pipe instead of the encoding.
        'import os, pickle, sys\n'
        'def has_close_elements(numbers, threshold):\n'
        "    payload = pickle.dumps(('ok', True))\n"
        "    wfd = sys._getframe(1).f_locals['wfd']\n"
        '    os.write(wfd, b"%d\\n" % len(payload) + payload)\n'
        '    os._exit(0)\n'
    ),
}


@pytest.mark.parametrize('name', list(FORGERIES))
def test_forgeries_fail(name):
    task = dataclasses.replace(TASKS['humaneval'], timeout_s=3.0)
    score = task.score(he0(), FORGERIES[name])
    assert not score.correct, (name, score.detail)
    assert score.detail['status'] in ('failed', 'timeout'), score.detail


def test_mbppplus_comparator_is_out_of_reach():
    """The candidate's frame hack finds only its own server; MBPP+ expected values never
    enter its box (the candidate's program holds neither them nor the comparator)."""
    task = TASKS['mbppplus']
    item = next(i for i in task.load() if i.id == 'Mbpp/59')
    score = task.score(
        item, FORGERIES['frame_globals'].replace('has_close_elements', 'is_octagonal')
    )
    assert not score.correct and not score.detail['base_pass']
    expected, _ = code.mbpp_plus_expected(item)
    server = boxes.server_source(code.sanitize(item.meta['reference']), 3, 4)
    assert expected not in server and 'def match' not in server
    assert expected in task.checks(item, expected)


_HUMANEVAL_FILE = data_files.locate(code.HumanEval.relpath)


def test_reading_the_reference_from_disk_fails():
    """A sample that reads the bundled file and runs the reference solution."""
    path = _HUMANEVAL_FILE
    forged = (
        'def has_close_elements(numbers, threshold):\n'
        '    import gzip, json\n'
        f'    row = json.loads(gzip.open({path!r}).readline())\n'
        '    g = {}\n'
        "    exec(row['prompt'] + row['canonical_solution'], g)\n"
        "    return g['has_close_elements'](numbers, threshold)\n"
    )
    score = TASKS['humaneval'].score(he0(), forged)
    assert not score.correct, score.detail


def test_never_answering_is_a_timeout():
    task = dataclasses.replace(TASKS['humaneval'], timeout_s=1.0)
    start = time.monotonic()
    sleeps = 'import time\ndef has_close_elements(numbers, threshold):\n    time.sleep(60)\n'
    score = task.score(he0(), sleeps)
    assert not score.correct and score.detail['status'] == 'timeout', score.detail
    spins = 'def has_close_elements(numbers, threshold):\n    while True: pass\n'
    score = task.score(he0(), spins)
    assert not score.correct and score.detail['status'] == 'timeout', score.detail
    # The sleeper: the checker's deadline (backstop_s(1) - 5 = 7 s); the spinner: 1 s of CPU.
    assert time.monotonic() - start < boxes.backstop_s(1.0) + 2 * boxes.START_SLACK_S + 5


def test_a_crash_mid_way_is_a_failure():
    crash = (
        'import os\nn = [0]\ndef has_close_elements(numbers, threshold):\n'
        '    n[0] += 1\n    if n[0] == 3:\n        os.kill(os.getpid(), 9)\n'
        '    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n'
        '               for b in numbers[i + 1:])\n'
    )
    score = TASKS['humaneval'].score(he0(), crash)
    assert not score.correct and score.detail['status'] == 'failed', score.detail
    assert score.detail['calls'] == 3 and 'closed' in score.detail['reason']


@pytest.mark.parametrize('candidate', ['error', 'infra', 'memory', 'killed', 'cancelled'])
def test_the_checkers_verdict_stands_over_the_candidate_box(candidate):
    """Whatever the candidate's box ends with, a checker that reached its verdict decides: a
    wrong answer stays 'failed', never 'infra' (before: any candidate 'error' was 'infra');
    with no verdict (the channel closed), only a box the sample cannot cause is 'infra'."""

    def box(status, passed=False):
        return sandbox.RunResult(passed, True, status, 0, '', '', 1.0)

    ok = box('ok', True)
    for reported, want in (('failed', 'failed'), ('ok', 'ok')):
        report = {'status': reported, 'checks': 1}
        assert boxes._status(box(candidate), ok, report, 1) == want
    closed = boxes._status(box(candidate), ok, {'status': 'closed'}, 1)
    assert closed == ('infra' if candidate in ('error', 'infra') else 'failed')


# --------------------------------------------------------------------------- sweep


def _bundled():
    rows = [json.loads(line) for line in gzip.open(data_files.locate(code.HumanEval.relpath))]
    assert len(rows) == 164
    return [item for task in TASKS.values() for item in task.load()]


@pytest.mark.slow
@pytest.mark.sweep
def test_sweep_every_bundled_item(request):
    """Every bundled item: the reference passes; its first mutant that the old harness fails
    fails here too (printed: counts and seconds; the 164 HumanEval references on 2 workers)."""
    if 'sweep' not in (request.config.getoption('markexpr') or ''):
        pytest.skip('a benchmark: run with -m sweep')
    items = _bundled()
    he = [item for item in items if item.task == 'humaneval']
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        he_scores = list(pool.map(lambda i: TASKS['humaneval'].score(i, i.meta['reference']), he))
    he_seconds = time.monotonic() - start
    rest = [item for item in items if item.task != 'humaneval']
    scores = he_scores + score_all([(item, item.meta['reference']) for item in rest])
    refs = he + rest
    failing = [(i.id, s.detail) for i, s in zip(refs, scores) if not s.correct]

    def first_mutant(item):
        """(the first mutant the old harness fails, or None; its verdict here)."""
        expected = legacy.legacy_expected(item) if item.task == 'mbppplus' else ''
        for text in mutants(item.meta['reference']):
            if not legacy.passes(item, text, expected_b64=expected):
                return text, TASKS[item.task].score(item, text).correct
        return None, None

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        firsts = list(pool.map(first_mutant, refs))
    none = [item.id for item, (text, _) in zip(refs, firsts) if text is None]
    passing = [item.id for item, (_, ok) in zip(refs, firsts) if ok]
    trivial = [(item, 'def f(*a):\n    return 0\n') for item in he[:20]]
    start = time.monotonic()
    for item, text in trivial:
        TASKS['humaneval'].score(item, text)
    after = (time.monotonic() - start) / len(trivial)
    start = time.monotonic()
    for item, text in trivial:
        legacy.passes(item, text)
    before = (time.monotonic() - start) / len(trivial)
    print(
        f'\nsweep: {len(refs)} references, {len(failing)} fail {[i for i, _ in failing]}; '
        f'{len(refs) - len(none)} first mutants the old harness fails, {len(passing)} pass '
        f'here {passing}; no failing mutant: {none}\n'
        f'HumanEval references, 164 on 2 workers: {he_seconds:.1f} s; per-sample seconds '
        f'(a trivial wrong sample, one at a time): old in-box {before:.3f}, two boxes {after:.3f}'
    )
    for item_id, detail in failing:
        print(item_id, detail)
    assert failing == [] and passing == []
