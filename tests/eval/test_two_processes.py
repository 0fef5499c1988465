"""Two processes on this machine, joined by `jax.distributed` over loopback (CPU
collectives by gloo), split an evaluation by sample and merge it; with both killed midway
(one host lost ends the job) and restarted, nothing is lost or duplicated. The same
evaluation on one mesh over both processes (`mesh.hosts='all'`) gives the same texts."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from spec_jax import checkpoints, distributed
from spec_jax.eval import records, runner, timing
from spec_jax.jobs.runtime import load_config
from spec_jax.testing.processes import start_processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = """
from spec_jax.jobs import evaluate


def get_config(arg=None):
    c = evaluate.default_config(tiny=True)
    c.name = 'two_processes'
    c.model = {model!r}  # An orbax target: its restores must not wait on the other process.
    c.grid = ('lenience:l=0.5',)  # With AR and lossless SD: three methods.
    c.tasks.gsm8k = evaluate.task(3, 6)
    c.tasks.humaneval = evaluate.task(2, 6)
    c.max_new_tokens = 6
    c.batch_size = 2
    c.prompt_bucket = c.max_prompt_len = 384
    c.meter_distortion = False
    c.progress = False
    c.score_workers = 1
    return c
"""


def _start(config: str, workdir: str, cache: str, *flags: str) -> list[subprocess.Popen]:
    argv = [sys.executable, 'launch/evaluate.py', '--config', config, '--workdir', workdir]
    return start_processes([*argv, *flags], 2, dict(SPEC_JAX_COMPILATION_CACHE=cache), ROOT)


def _new_samples(output: str) -> int:
    """The 'N new samples' figure a process of the evaluation job prints at the end."""
    found = re.findall(r'^(\d+) new samples', output, re.M)
    assert len(found) == 1, output[-3000:]
    return int(found[0])


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        # Whole lines only; the drift monitor's (AR re-timed, not a sample of the plan) left out.
        return [line for line in f.read().split('\n')[:-1]
                if line and f'"method": "{timing.MONITOR}' not in line]  # fmt: skip (all its names)


def test_two_processes_split_merge_and_survive_a_kill(tmp_path):
    tiny = checkpoints.load('random:tiny')
    target = checkpoints.save_orbax(tmp_path / 'target', tiny.cfg, tiny.params, tiny.tokenizer)
    config = tmp_path / 'two.py'
    config.write_text(CONFIG.format(model=target))
    c = load_config(str(config))
    workdir, cache = str(tmp_path / 'run'), str(tmp_path / 'cache')
    items = [(name, it.id) for name, (_, its) in runner.load_items(c).items() for it in its]
    methods = [m.name for m in runner.methods_of(c)]
    expected = {(m, name, item, 0) for m in methods for name, item in items}
    share = {key: i for i in range(2) for key in distributed.share(items, i, 2)}

    # First run: once process 1 has written a result, both are killed.
    procs = _start(str(config), workdir, cache)
    part = [os.path.join(workdir, records.process_results(i)) for i in range(2)]
    deadline = time.time() + 300
    while not _lines(part[1]):
        assert time.time() < deadline and all(p.poll() is None for p in procs), [
            p.communicate()[0][-3000:] for p in procs if p.poll() is not None
        ]
        time.sleep(0.2)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    before = [_lines(path) for path in part]
    assert before[1] and len(before[0]) + len(before[1]) < len(expected)
    for i, lines in enumerate(before):  # Each process wrote only its own share.
        assert {share[json.loads(line)['task'], json.loads(line)['item']] for line in lines} <= {i}

    # Restarted with the same command: each finishes its share, process 0 merges.
    procs = _start(str(config), workdir, cache)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-3000:] for out in outs]
    assert 'report:' in outs[0] and 'report:' not in outs[1]  # Process 0 alone reports.
    # Between them they decoded exactly the samples missing after the kill.
    done_before = len(before[0]) + len(before[1])
    assert sum(_new_samples(out) for out in outs) == len(expected) - done_before, outs
    assert os.path.isfile(os.path.join(workdir, 'report', 'report.md'))
    merged = _lines(os.path.join(workdir, records.RESULTS))
    keys = [records.row_key(json.loads(line)) for line in merged]
    assert len(keys) == len(set(keys)) and set(keys) == expected  # Nothing lost or doubled.
    assert not any(os.path.exists(path) for path in part)  # Merged, then removed.
    kept = set(merged)
    assert all(line in kept for lines in before for line in lines)  # Not redone.

    # Process 0's share undone again: it restores the orbax target and decodes alone while
    # process 1, whose share is done, waits at the barrier (no restore of its own).
    with open(os.path.join(workdir, records.RESULTS), 'w') as f:
        f.write(
            ''.join(
                line + '\n'
                for line in merged
                if share[json.loads(line)['task'], json.loads(line)['item']] == 1
            )
        )
    procs = _start(str(config), workdir, cache)
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-3000:] for out in outs]
    redone = len(expected) - sum(share[key[1], key[2]] for key in expected)
    assert [_new_samples(out) for out in outs] == [redone, 0]
    assert len(_lines(os.path.join(workdir, records.RESULTS))) == len(expected)

    # One mesh over both processes (data 2: a row of each batch pair on each process):
    # every batch decoded together, process 0 writes; the same text for every sample.
    together = str(tmp_path / 'together')
    procs = _start(str(config), together, cache, '--config.mesh.hosts=all',
                   '--config.mesh.data=2')  # fmt: skip
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-3000:] for out in outs]
    assert [_new_samples(out) for out in outs] == [len(expected), 0]  # Process 0 writes.
    rows = [json.loads(line) for line in _lines(os.path.join(together, records.RESULTS))]
    assert {records.row_key(r) for r in rows} == expected and len(rows) == len(expected)
    split = {records.row_key(json.loads(line)): json.loads(line)['text'] for line in merged}
    assert {records.row_key(r): r['text'] for r in rows} == split
