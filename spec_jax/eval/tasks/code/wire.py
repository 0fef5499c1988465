"""The plain-data encoding that crosses between a candidate's box and the trusted checker.

Only data crosses, never code or objects: None, bools, ints, floats (nan, inf and -0.0
kept), complex numbers, strings, bytes, lists, tuples, dicts, sets and frozensets. A value
of any other type (a class instance, a generator, an object with its own `__eq__`) cannot be
encoded: `WireError`, and the sample fails. Subclasses of those types (a Counter, a
namedtuple, a numpy float) are encoded as their base type, and integers of other kinds
(numpy ints) through `__index__`: what crosses is the value, whatever methods the sender's
object had.

Format: a value is a tag byte then its body. `N` None, `T` / `F` bools, `i<hex>;` ints (hex:
no digit-count limit), `f<repr>;` floats, `c<repr>;<repr>;` complex, `s<len>:<utf-8>` strings
(surrogates kept), `b<len>:<bytes>` bytes, and `l` / `t` / `S` / `Z` (list, tuple, set,
frozenset) and `d` (dict, key then value) as `<count>:` then the items. Decoding parses
these by hand (no pickle, no eval, no json): nesting deeper than `max_depth`, more than
`max_items` values, a message over `max_bytes`, trailing bytes, or anything malformed (an
unhashable set element, a bad number) is a `WireError`.

Frames on a pipe: `<len>\\n<payload>` (`write_frame`, `read_frame`; the reader refuses a
length over its limit and honours a deadline).

Standard library only and no package imports: the boxes run `-I` with the standard library,
so the programs that run there inline this module's source (`boxes.WIRE_SOURCE`).
"""

import os
import select
import time

MAX_DEPTH = 100
MAX_ITEMS = 1_000_000
MAX_BYTES = 16 << 20
MAX_INT_DIGITS = 1 << 16  # Hex digits of an int (2**262144); parsing is linear in them.


class WireError(ValueError):
    """A value that cannot be encoded, or bytes that do not decode."""


def encode(value, max_depth=MAX_DEPTH, max_items=MAX_ITEMS, max_bytes=MAX_BYTES):
    """The bytes of `value` (see the module docstring); WireError for other types or a value
    past the bounds."""
    out = []
    state = [0, 0]  # values, bytes

    def put(chunk):
        state[1] += len(chunk)
        if state[1] > max_bytes:
            raise WireError(f'the value is over {max_bytes} bytes encoded')
        out.append(chunk)

    def enc(x, depth):
        state[0] += 1
        if state[0] > max_items:
            raise WireError(f'the value has over {max_items} items')
        if depth > max_depth:
            raise WireError(f'the value is nested deeper than {max_depth}')
        if x is None:
            put(b'N')
        elif x is True or x is False:
            put(b'T' if x else b'F')
        elif isinstance(x, bool):
            put(b'T' if bool.__bool__(x) else b'F')
        elif isinstance(x, int):
            digits = format(int.__index__(x), 'x').encode()
            if len(digits) > MAX_INT_DIGITS + 1:
                raise WireError(f'an int of over {MAX_INT_DIGITS} hex digits')
            put(b'i' + digits + b';')
        elif isinstance(x, float):
            put(b'f' + float.__repr__(x).encode() + b';')
        elif isinstance(x, complex):
            c = complex(x)
            put(b'c' + repr(c.real).encode() + b';' + repr(c.imag).encode() + b';')
        elif isinstance(x, str):
            data = str.__str__(x).encode('utf-8', 'surrogatepass')
            put(b's%d:' % len(data))
            put(data)
        elif isinstance(x, (bytes, bytearray)):
            data = bytes(x)
            put(b'b%d:' % len(data))
            put(data)
        elif isinstance(x, dict):
            items = list(dict.items(x))
            put(b'd%d:' % len(items))
            for k, v in items:
                enc(k, depth + 1)
                enc(v, depth + 1)
        elif isinstance(x, (list, tuple, set, frozenset)):
            if isinstance(x, list):
                tag, items = b'l', list.__iter__(x)
            elif isinstance(x, tuple):
                tag, items = b't', tuple.__iter__(x)
            elif isinstance(x, set):
                tag, items = b'S', set.__iter__(x)
            else:
                tag, items = b'Z', frozenset.__iter__(x)
            items = list(items)
            put(tag + b'%d:' % len(items))
            for item in items:
                enc(item, depth + 1)
        elif hasattr(type(x), '__index__') and type(x).__name__.startswith(('int', 'uint')):
            put(b'i' + format(int(type(x).__index__(x)), 'x').encode() + b';')
        else:
            raise WireError(f'a value of type {type(x).__name__} cannot cross (plain data only)')

    enc(value, 0)
    return b''.join(out)


def decode(data, max_depth=MAX_DEPTH, max_items=MAX_ITEMS, max_bytes=MAX_BYTES):
    """The value of `data` (bytes from `encode`); WireError for anything else."""
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(f'decode takes bytes, got {type(data).__name__}')
    data = bytes(data)
    if len(data) > max_bytes:
        raise WireError(f'the message is over {max_bytes} bytes')
    pos = [0]
    count = [0]

    def until(stop, limit=400):
        i = pos[0]
        j = data.find(stop, i, i + limit + 1)
        if j < 0:
            raise WireError(f'malformed message at byte {i}')
        pos[0] = j + 1
        return data[i:j].decode('ascii')

    def number(text, kind):
        if not text:
            raise WireError(f'bad {kind} at byte {pos[0]}')
        try:
            return int(text, 16) if kind == 'int' else float(text)
        except ValueError:
            raise WireError(f'bad {kind} {text[:40]!r}') from None

    def size():
        text = until(b':')
        if not text.isdigit() or len(text) > 12:
            raise WireError(f'bad length {text[:40]!r}')
        return int(text)

    def dec(depth):
        count[0] += 1
        if count[0] > max_items:
            raise WireError(f'the message has over {max_items} items')
        if depth > max_depth:
            raise WireError(f'the message is nested deeper than {max_depth}')
        i = pos[0]
        if i >= len(data):
            raise WireError('the message ends early')
        tag = data[i : i + 1]
        pos[0] = i + 1
        if tag == b'N':
            return None
        if tag == b'T':
            return True
        if tag == b'F':
            return False
        if tag == b'i':
            text = until(b';', MAX_INT_DIGITS)
            sign, digits = (-1, text[1:]) if text.startswith('-') else (1, text)
            if not all(ch in '0123456789abcdef' for ch in digits):
                raise WireError(f'bad int {text[:40]!r}')
            return sign * number(digits, 'int')
        if tag == b'f':
            text = until(b';')
            if not all(ch in '0123456789.eE+-naift' for ch in text):
                raise WireError(f'bad float {text[:40]!r}')
            return number(text, 'float')
        if tag == b'c':
            real = number(until(b';'), 'float')
            return complex(real, number(until(b';'), 'float'))
        if tag in (b's', b'b'):
            n = size()
            start, end = pos[0], pos[0] + n
            if end > len(data):
                raise WireError('the message ends inside a string')
            pos[0] = end
            raw = data[start:end]
            if tag == b'b':
                return raw
            try:
                return raw.decode('utf-8', 'surrogatepass')
            except UnicodeDecodeError:
                raise WireError('a string is not utf-8') from None
        if tag == b'd':
            n = size()
            if n > max_items:
                raise WireError(f'the message has over {max_items} items')
            out = {}
            for _ in range(n):
                k = dec(depth + 1)
                try:
                    out[k] = dec(depth + 1)
                except TypeError:
                    raise WireError('an unhashable dict key') from None
            return out
        if tag in (b'l', b't', b'S', b'Z'):
            n = size()
            if n > max_items:
                raise WireError(f'the message has over {max_items} items')
            items = [dec(depth + 1) for _ in range(n)]
            if tag == b'l':
                return items
            if tag == b't':
                return tuple(items)
            try:
                return set(items) if tag == b'S' else frozenset(items)
            except TypeError:
                raise WireError('an unhashable set element') from None
        raise WireError(f'unknown tag {tag!r} at byte {i}')

    value = dec(0)
    if pos[0] != len(data):
        raise WireError(f'{len(data) - pos[0]} trailing bytes')
    return value


def write_frame(fd, payload):
    """Writes one frame (`<len>\\n<payload>`) to `fd`."""
    view = memoryview(b'%d\n' % len(payload) + payload)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError('no answer before the deadline')
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            raise TimeoutError('no answer before the deadline')
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError('the other side closed the channel')
        chunks.append(chunk)
        got += len(chunk)
    return b''.join(chunks)


def read_frame(fd, deadline, max_bytes=MAX_BYTES):
    """One frame's payload from `fd` by `deadline` (time.monotonic()); TimeoutError past it,
    EOFError at end of input, WireError for a bad header or a frame over `max_bytes`."""
    header = b''
    while not header.endswith(b'\n'):
        if len(header) > 20:
            raise WireError(f'bad frame header {header[:20]!r}')
        header += _read_exact(fd, 1, deadline)
    text = header[:-1]
    if not text.isdigit():
        raise WireError(f'bad frame header {text[:20]!r}')
    n = int(text)
    if n > max_bytes:
        raise WireError(f'a frame of {n} bytes is over the limit of {max_bytes}')
    return _read_exact(fd, n, deadline)
