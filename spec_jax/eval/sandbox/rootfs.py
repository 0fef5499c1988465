"""The sample's private root: what it sees of the filesystem, and how the launcher builds it.

`plan(python)` (the caller, once per interpreter) finds what the interpreter needs: its
prefix (the standard library, lib-dynload, the base site-packages), the directories of every
shared object it maps after importing each of its lib-dynload extension modules (found from a
probe's /proc/self/maps: libc, libm, libssl, libffi, ..., the ELF loader, the locale and gconv
files), the symlinks on the way to them (merged /usr: /lib -> usr/lib, /lib64 -> usr/lib64) and
/etc/ld.so.cache (where the loader looks sonames up). `build(libc, cfg)` (the namespace's init,
before the sample starts) mounts a fresh tmpfs as the new root, recreates those symlinks,
binds those directories and files read-only (nosuid, nodev) at their own paths, adds a private
/dev (tmpfs: null, zero, full, random and urandom bound from the host, /dev/fd and the std*
links, a private /dev/shm; no tty, no ptmx, no pts), fresh tmpfs /tmp (with the scratch dir)
and /var/tmp (memory of the run's cgroup, `scratch_bytes` each, noexec: no binary the sample
writes runs from them), a /proc of the sample's PID namespace, then pivot_roots into it,
detaches the old root and remounts the new root read-only. Nothing else of the host exists
there: no repository, no home, no data directories, no /run, no host /tmp, no /sys, no /etc
beyond ld.so.cache.

Standard library only: the launcher loads this file by its path (it runs under -I -S).
"""

from __future__ import annotations

import ctypes
import os
import subprocess

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {'x86_64': 155, 'aarch64': 41}
DEVICES = ('null', 'zero', 'full', 'random', 'urandom')
LOADERS = ('/lib64/ld-linux-x86-64.so.2', '/lib/ld-linux-aarch64.so.1')
FILES = ('/etc/ld.so.cache',)

# Run by the interpreter under test: import every extension module it ships, then list the
# files it has mapped (the shared libraries a sample can reach with the standard library).
_PROBE = r"""
import glob, importlib, os, sys
for f in glob.glob(os.path.join(os.path.dirname(os.__file__), 'lib-dynload', '*.so')):
    name = os.path.basename(f).split('.')[0]
    if 'test' in name or name in ('_tkinter', 'xxlimited', 'xxlimited_35'):
        continue
    try:
        importlib.import_module(name)
    except BaseException:
        pass
print(os.path.realpath(sys.base_prefix))
for line in open('/proc/self/maps'):
    parts = line.split(None, 5)
    if len(parts) == 6 and parts[5].startswith('/') and not parts[5].endswith('(deleted)\n'):
        print(parts[5].rstrip('\n'))
"""


def _walk(path: str, links: dict, depth: int = 0) -> str:
    """The real path of `path`, recording each symlink met on the way in `links`."""
    if depth > 40:
        raise OSError(f'too many symlinks resolving {path}')
    parts = [p for p in path.split('/') if p]
    cur = ''
    for i, part in enumerate(parts):
        nxt = f'{cur}/{part}'
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            base = os.path.normpath(os.path.join(cur or '/', target))
            rest = '/'.join(parts[i + 1 :])
            return _walk(f'{base}/{rest}' if rest else base, links, depth + 1)
        cur = nxt
    return cur or '/'


def plan(python: str) -> dict:
    """What the private root holds for `python`: {'dirs': [...], 'files': [...], 'links':
    [[path, target], ...]} (see the module docstring). Runs the interpreter once."""
    out = subprocess.run(
        [python, '-I', '-c', _PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={'PATH': '/usr/bin:/bin', 'LANG': 'C.UTF-8'},
        cwd='/',
    ).stdout.splitlines()
    links: dict = {}
    dirs = {_walk(out[0], links), os.path.dirname(_walk(python, links))}
    for path in out[1:]:
        dirs.add(os.path.dirname(_walk(path, links)))
    for loader in LOADERS:
        if os.path.exists(loader):
            dirs.add(os.path.dirname(_walk(loader, links)))
    files = [_walk(f, links) for f in FILES if os.path.isfile(f)]
    dirs = sorted(d for d in dirs if d != '/')
    dirs = [d for d in dirs if not any(d.startswith(p + '/') for p in dirs)]
    within = lambda p: any(p.startswith(d + '/') for d in dirs)  # noqa: E731
    links = {p: t for p, t in links.items() if not within(p)}
    return {'dirs': dirs, 'files': files, 'links': sorted(links.items())}


def _check(libc, ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f'{what}: {os.strerror(err)}')


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ret = libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(libc, ret, f'mount {source} on {target}')


def _bind(libc, source: str, target: str, flags: int) -> None:
    """A non-recursive bind of `source` at `target`, remounted with `flags`."""
    _mount(libc, source, target, None, _MS_BIND)
    _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | flags)


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def build(libc, cfg: dict) -> None:
    """Builds the private root at cfg['root'] (an empty directory) and pivots into it; the
    caller's cwd is then '/' of the new root. cfg: 'rootfs' (a `plan`), 'scratch',
    'scratch_bytes', 'uid'."""
    root, layout = cfg['root'], cfg['rootfs']
    _mount(libc, None, '/', None, _MS_REC | _MS_PRIVATE)
    _mount(libc, 'tmpfs', root, 'tmpfs', _MS_NOSUID | _MS_NODEV, 'size=1m,mode=0755')
    at = lambda p: root + p  # noqa: E731
    for path, target in layout['links']:
        os.makedirs(at(os.path.dirname(path)), 0o755, exist_ok=True)
        os.symlink(target, at(path))
    ro = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
    for path in layout['dirs']:
        os.makedirs(at(path), 0o755, exist_ok=True)
        _bind(libc, path, at(path), ro)
    for path in layout['files']:
        os.makedirs(at(os.path.dirname(path)), 0o755, exist_ok=True)
        _touch(at(path))
        _bind(libc, path, at(path), ro)
    os.makedirs(at('/dev'), 0o755)
    _mount(libc, 'tmpfs', at('/dev'), 'tmpfs', _MS_NOSUID | _MS_NOEXEC, 'size=64k,mode=0755')
    for name in DEVICES:
        _touch(at(f'/dev/{name}'))
        _bind(libc, f'/dev/{name}', at(f'/dev/{name}'), _MS_NOSUID | _MS_NOEXEC)
    os.symlink('/proc/self/fd', at('/dev/fd'))
    for i, name in enumerate(('stdin', 'stdout', 'stderr')):
        os.symlink(f'/proc/self/fd/{i}', at(f'/dev/{name}'))
    tmpfs = f'size={cfg["scratch_bytes"]},nr_inodes=65536,mode=1777'
    for path in ('/dev/shm', '/tmp', '/var/tmp'):
        os.makedirs(at(path), 0o755, exist_ok=True)
        _mount(libc, 'tmpfs', at(path), 'tmpfs', _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, tmpfs)
    _mount(libc, None, at('/dev'), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    os.makedirs(at('/proc'), 0o555)
    _mount(libc, 'proc', at('/proc'), 'proc', _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(at(cfg['scratch']), 0o700)
    if cfg['uid'] is not None:
        os.chown(at(cfg['scratch']), cfg['uid'], cfg['uid'])
    os.mkdir(at('/.old'), 0o700)
    nr = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(f'pivot_root: unknown architecture {os.uname().machine!r}')
    _check(libc, libc.syscall(nr, root.encode(), at('/.old').encode()), 'pivot_root')
    os.chdir('/')
    _check(libc, libc.umount2(b'/.old', _MNT_DETACH), 'umount /.old')
    os.rmdir('/.old')
    _mount(libc, None, '/', None, _MS_REMOUNT | ro)
