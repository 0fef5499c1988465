"""The sample's syscall filter, built with libseccomp (the maintained library) through ctypes.

Why libseccomp through ctypes: the launcher runs standard-library-only under `python -I -S`
(it must not import the package or site-packages, which the sample could shadow), so a Python
binding (`pyseccomp`, the `seccomp` module of libseccomp's own build) cannot reach it cleanly;
the C library `libseccomp.so.2` is on every distribution that ships systemd, and its
`seccomp_rule_add_array` takes argument comparisons by pointer, which ctypes can pass. The
library resolves syscall names per architecture (x86_64, aarch64, ...) and makes the filter
kill a process that calls through another architecture's ABI (SCMP_FLTATR_ACT_BADARCH, its
default), so x32 or i386 entry points cannot dodge the rules. Without the library `install`
raises and `available()` is False: the caller then refuses untrusted code unless the weaker
mode is allowed (see the package docstring).

Loaded by the launcher by its path (importlib), and imported normally by the caller side for
`available()`. Standard library only.

What is refused (EPERM unless said otherwise), and why:
- namespace creation: `unshare` (any flags), `clone` with any CLONE_NEW* flag (its flags are a
  register argument the filter can read), `clone3` with ENOSYS (its flags live in memory a
  filter cannot read; glibc falls back to `clone` on ENOSYS), `setns`: kernel attack surface
  (a user namespace hands out full capabilities over its own objects);
- mounts: `mount`, `umount2`, `pivot_root`, `chroot` and the new mount API (`open_tree`,
  `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`);
- other processes' memory: `ptrace`, `process_vm_readv`, `process_vm_writev`;
- large kernel surfaces no test needs: `bpf`, `keyctl`, `add_key`, `request_key`,
  `perf_event_open`, `io_uring_setup`, `io_uring_enter`, `io_uring_register`, `userfaultfd`;
- terminal injection: `ioctl(fd, TIOCSTI)` (typing into a terminal) and `ioctl(fd, TIOCLINUX)`;
- channels through the inodes every box shares (the read-only binds of the interpreter and the
  libraries are the host's inodes): `flock`, the fcntl lock commands (F_GETLK, F_SETLK,
  F_SETLKW, their OFD forms, F_SETLEASE) and F_NOTIFY (dnotify), `inotify_*`, `fanotify_*`:
  two concurrent samples decoded each other's bytes through flock and inotify, and saw which
  modules other boxes imported (a sample's own files get no locks either: sqlite3 on a file
  fails, `:memory:` works);
- machine-wide budgets: the Linux AIO calls (`io_setup` takes from `fs.aio-max-nr`, shared by
  the host: 65536 events starved host processes' io_setup), `memfd_secret` (memory outside
  the page cache, counted against RLIMIT_MEMLOCK);
- sockets, on an allow-list of domains: `socket` in every domain (AF_UNIX: the network
  namespace does not cover path or abstract sockets, which could reach a host daemon; AF_VSOCK:
  no namespace covers vsock, whose port space is the host's and which reaches the hypervisor,
  CID 2; INET, INET6, NETLINK and the rest: kernel surface no task needs), and `socketpair`
  in every domain but AF_UNIX (`SOCKET_DOMAINS`): a pair names nothing outside the box's
  process tree (asyncio and multiprocessing use one). The filter refuses them itself (EPERM,
  not the kernel's EAFNOSUPPORT), whatever the namespaces, so every isolation level that
  installs it holds them.
"""

from __future__ import annotations

import ctypes
import errno

_ACT_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7
_CLONE_NEW = {
    'CLONE_NEWNS': 0x00020000,
    'CLONE_NEWCGROUP': 0x02000000,
    'CLONE_NEWUTS': 0x04000000,
    'CLONE_NEWIPC': 0x08000000,
    'CLONE_NEWUSER': 0x10000000,
    'CLONE_NEWPID': 0x20000000,
    'CLONE_NEWNET': 0x40000000,
}
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_AF_UNIX = 1
_CMP_NE = 1
SOCKET_DOMAINS = (_AF_UNIX,)  # The one domain `socketpair` may use; `socket` may use none.
REFUSED = (
    'unshare', 'setns', 'mount', 'umount2', 'pivot_root', 'chroot', 'open_tree', 'move_mount',
    'fsopen', 'fsconfig', 'fsmount', 'fspick', 'mount_setattr', 'ptrace', 'process_vm_readv',
    'process_vm_writev', 'bpf', 'keyctl', 'add_key', 'request_key', 'perf_event_open',
    'io_uring_setup', 'io_uring_enter', 'io_uring_register', 'userfaultfd',
    'flock', 'inotify_init', 'inotify_init1', 'inotify_add_watch', 'inotify_rm_watch',
    'fanotify_init', 'fanotify_mark', 'io_setup', 'io_destroy', 'io_submit', 'io_cancel',
    'io_getevents', 'io_pgetevents', 'memfd_secret',
)  # fmt: skip
# fcntl commands refused (include/uapi/asm-generic/fcntl.h, linux/fcntl.h): F_GETLK, F_SETLK,
# F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY (the 64-bit numbers;
# 'fcntl64', on 32-bit ABIs, gets the same rules).
FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1024, 1026)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ('arg', ctypes.c_uint),
        ('op', ctypes.c_int),
        ('datum_a', ctypes.c_uint64),
        ('datum_b', ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def _library():
    lib = ctypes.CDLL('libseccomp.so.2', use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    """True if libseccomp can be loaded (the kernel's support is checked by `install`)."""
    try:
        _library()
    except OSError:
        return False
    return True


def install(lib=None) -> None:
    """Loads the filter into the calling thread (inherited by its children and kept across
    exec). Needs PR_SET_NO_NEW_PRIVS set (or CAP_SYS_ADMIN). `lib`: a handle from `_library()`
    (the launcher opens it before the private root hides the file). Raises OSError."""
    lib = lib or _library()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError('seccomp_init failed')
    try:

        def rule(name: str, action: int, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # Not a syscall on this architecture (e.g. an old kernel's headers).
                return
            array = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
            ret = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
            if ret < 0:
                raise OSError(-ret, f'seccomp_rule_add {name}: {errno.errorcode.get(-ret)}')

        eperm = _errno_action(errno.EPERM)
        for name in REFUSED:
            rule(name, eperm)
        rule('clone3', _errno_action(errno.ENOSYS))
        # clone's flags: argument 0 on x86_64 and aarch64 (libseccomp knows s390's order).
        for flag in _CLONE_NEW.values():
            rule('clone', eperm, (0, _CMP_MASKED_EQ, flag, flag))
        for request in (_TIOCSTI, _TIOCLINUX):
            rule('ioctl', eperm, (1, _CMP_MASKED_EQ, 0xFFFFFFFF, request))
        for command in FCNTL_REFUSED:  # The kernel reads the command as an int.
            for name in ('fcntl', 'fcntl64'):
                rule(name, eperm, (1, _CMP_MASKED_EQ, 0xFFFFFFFF, command))
        rule('socket', eperm)  # Every domain: SOCKET_DOMAINS holds for pairs only.
        # socketpair outside the list: the whole 64-bit argument must equal the one domain, so
        # high bits above the int the kernel reads refuse the call too.
        (domain,) = SOCKET_DOMAINS
        rule('socketpair', eperm, (0, _CMP_NE, domain, 0))
        ret = lib.seccomp_load(ctx)
        if ret < 0:
            raise OSError(-ret, f'seccomp_load: {errno.errorcode.get(-ret)}')
    finally:
        lib.seccomp_release(ctx)
