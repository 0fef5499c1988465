"""Results files of one or several processes: each appends to its own, reads see all of
them (a sample's first line wins), and the merge keeps every sample once."""

import json
import os

from spec_jax.eval import records


def row(item, text='x', method='ar'):
    return dict(method=method, task='t', item=str(item), seed=0, text=text)


def test_process_files_read_together_repaired_by_their_writer_and_merged(tmp_path):
    workdir = str(tmp_path)
    config, plan = {'name': 'a'}, []
    main = records.ResultStore(workdir, config, plan)
    main.append([row(0, 'main')])
    p0 = records.ResultStore(workdir, config, plan, process=(0, 2))
    p1 = records.ResultStore(workdir, config, plan, process=(1, 2))
    assert p0.path.endswith('results.p0.jsonl') and p1.path.endswith('results.p1.jsonl')
    p0.append([row(0, 'again'), row(2)])  # Item 0 is done already: not written.
    p1.append([row(1), row(3)])
    with open(p1.path, 'a') as f:
        f.write('{"method": "ar", "task": "t", "it')  # A torn line of a killed process 1.
    torn = os.path.getsize(p1.path)
    # Process 0 reopens: it sees every whole line and leaves process 1's file alone.
    p0 = records.ResultStore(workdir, config, plan, process=(0, 2))
    assert sorted(r['item'] for r in p0.rows) == ['0', '1', '2', '3']
    assert os.path.getsize(p1.path) == torn
    p1 = records.ResultStore(workdir, config, plan, process=(1, 2))  # Its writer cuts it.
    assert os.path.getsize(p1.path) < torn
    p1.append([row(5)])
    # Restarted as one process: it sees every file and appends to results.jsonl.
    one = records.ResultStore(workdir, config, plan)
    assert one.done == {('ar', 't', str(i), 0) for i in (0, 1, 2, 3, 5)}
    one.append([row(3, 'again'), row(6)])
    p0.merge()
    assert p0.files() == [os.path.join(workdir, records.RESULTS)]
    with open(p0.path) as f:
        merged = [json.loads(line) for line in f]
    assert [(r['item'], r['text']) for r in merged] == [
        ('0', 'main'), ('6', 'x'), ('2', 'x'), ('1', 'x'), ('3', 'x'), ('5', 'x')
    ]  # fmt: skip
    again = records.ResultStore.read_only(workdir)
    assert len(again.rows) == 6 and again.done == p0.done
    p0.merge()  # Nothing left to merge: unchanged.
    assert records.ResultStore.read_only(workdir).rows == again.rows
