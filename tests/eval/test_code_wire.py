"""The plain-data encoding between the boxes: round trips of every type, the bounds, and
hostile bytes that fail cleanly (no pickle, no eval)."""

import collections
import math
import os
import pickle
import random
import time

import pytest

from spec_jax.eval.tasks.code import boxes, wire

VALUES = [
    None, True, False, 0, 1, -1, 2**300, -(2**300), 2**20000, 0.0, -0.0, 1.5, -2.25e-310,
    1e308, float('inf'), float('-inf'), 1 + 2j, complex(float('inf'), -0.0), '', 'abc',
    'h\u00e9\u4e16\U0001f600', '\ud800 lone surrogate', 'a;b:c\n', b'', b'\x00\xff;:', [], (),
    {}, set(), frozenset(), [1, [2, [3, []]]], ((1,), ((2, 3),)), {'a': [1, 2], (1, 2): {3: None}},
    {1, 'x', (2, 3)}, frozenset({frozenset({1}), 2}), {frozenset({1}): {(): b'x'}},
]  # fmt: skip


@pytest.mark.parametrize('value', VALUES, ids=range(len(VALUES)))
def test_round_trip_keeps_value_and_type(value):
    out = wire.decode(wire.encode(value))
    assert out == value and type(out) is type(value)
    if not isinstance(value, int) or abs(value) < 10**100:
        assert repr(out) == repr(value)  # -0.0, nested types, complex signs


def test_nan_and_nested_types():
    out = wire.decode(wire.encode([float('nan'), (1, [2.0, (3,)]), {1: (True,)}]))
    assert math.isnan(out[0]) and type(out[1]) is tuple and type(out[1][1]) is list
    assert type(out[1][1][1]) is tuple and out[2] == {1: (True,)} and out[2][1][0] is True
    assert type(wire.decode(wire.encode(True))) is bool  # not 1


def test_subclasses_cross_as_their_base_type():
    point = collections.namedtuple('Point', 'x y')
    out = wire.decode(wire.encode([point(1, 2), collections.Counter('aab'),
                                   collections.OrderedDict(a=1)]))  # fmt: skip
    assert out == [(1, 2), {'a': 2, 'b': 1}, {'a': 1}]
    assert [type(x) for x in out] == [tuple, dict, dict]


def test_other_types_cannot_cross():
    class Yes:
        def __eq__(self, other):
            return True

    for value in (Yes(), [1, Yes()], {'k': Yes()}, iter([1]), (x for x in ()), object, print):
        with pytest.raises(wire.WireError, match='cannot cross'):
            wire.encode(value)


def test_bounds_refuse():
    deep = True
    for _ in range(101):
        deep = [deep]
    with pytest.raises(wire.WireError, match='deeper'):
        wire.encode(deep)
    with pytest.raises(wire.WireError, match='deeper'):
        wire.decode(b'l1:' * 101 + b'N')
    assert wire.decode(b'l1:' * 100 + b'N') is not None
    with pytest.raises(wire.WireError, match='items'):
        wire.encode([0] * 11, max_items=10)
    with pytest.raises(wire.WireError, match='items'):
        wire.decode(wire.encode([0] * 11), max_items=10)
    with pytest.raises(wire.WireError, match='bytes'):
        wire.encode('x' * 100, max_bytes=50)
    with pytest.raises(wire.WireError, match='bytes'):
        wire.decode(wire.encode('x' * 100), max_bytes=50)
    start = time.monotonic()
    with pytest.raises(wire.WireError):
        wire.decode(b'l1:' * 10**6 + b'N')  # a deep frame fails fast, no RecursionError
    assert time.monotonic() - start < 1


HOSTILE = [
    b'', b'X', b'N trailing', b'i;', b'i0x10;', b'i1_0;', b'i-;', b'i' + b'f' * 70000 + b';',
    b'f__import__("os").system("true");', b"feval('1');", b'f1e5', b'c1;', b'fnan', b's5:ab',
    b's3:\xff\xfe\xfd', b'b-1:', b'l99999999999999:', b'l2:N', b'S1:l0:', b'd1:l0:N', b'Z1:d0:',
    b'd1:N', pickle.dumps(('ok', True)), pickle.dumps(os.system),
    b'cos\nsystem\n(S"true"\ntR.',
]  # fmt: skip


@pytest.mark.parametrize('data', HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bytes_fail_cleanly(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_random_bytes_fail_cleanly():
    rng = random.Random(30)
    alphabet = b'NTFiflctsbdSZ0123456789:;-.e'
    for _ in range(3000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        try:
            wire.decode(data)
        except wire.WireError:
            pass


def test_no_pickle_no_eval():
    source = boxes.WIRE_SOURCE
    words = ('import pickle', 'pickle.', 'eval(', 'exec(', 'literal_eval', 'import json',
             'marshal', 'import ast', '__import__')  # fmt: skip
    for word in words:
        assert word not in source


def test_frames_on_a_pipe():
    def pipe_with(data):
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        return r

    r, w = os.pipe()
    wire.write_frame(w, b'hello')
    assert wire.read_frame(r, time.monotonic() + 5) == b'hello'
    with pytest.raises(TimeoutError):
        wire.read_frame(r, time.monotonic() + 0.1)
    os.close(w)
    with pytest.raises(EOFError):
        wire.read_frame(r, time.monotonic() + 5)
    os.close(r)
    cases = [(b'100\n' + b'x' * 100, 'over the limit'), (b'12x\n', 'header'),
             (b'9' * 30, 'header'), (b'5\nab', 'closed')]  # fmt: skip
    for data, match in cases:
        r = pipe_with(data)
        with pytest.raises((wire.WireError, EOFError), match=match):
            wire.read_frame(r, time.monotonic() + 5, max_bytes=50)
        os.close(r)
