"""The harness: the Python the sample's interpreter runs (`-c`), around the untrusted source.

It runs as the sample (the unprivileged uid): reads the source from fd 0, puts /dev/null
there, installs the socket audit hook, runs the source as module '__sandbox__' and, only if
that returns, writes the token and its pid to the result fd (the sentinel that `passed`
needs); `__sandbox_report__(obj)` writes `R <json>` lines to the same fd.
"""

# Placeholders: FD, TOKEN, BLOCK (filled in by `harness_source`).
_WRAPPER = r"""
import os as _os, sys as _sys
def _sandbox_main(fd=@FD@, token=@TOKEN@, block=@BLOCK@):
    chunks = []
    while True:
        b = _os.read(0, 1 << 20)
        if not b:
            break
        chunks.append(b)
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)
    if block:
        import socket
        unix = int(socket.AF_UNIX)
        refused = {'socket.connect', 'socket.bind', 'socket.sendto', 'socket.sendmsg',
                   'socket.getaddrinfo', 'socket.gethostbyname', 'socket.gethostbyname_ex',
                   'socket.gethostbyaddr', 'socket.getnameinfo'}
        def hook(event, args):
            if event == 'socket.__new__' and args[1] != unix or event in refused:
                raise PermissionError(f'{event}: network access is disabled in the sandbox')
        _sys.addaudithook(hook)
    def report(obj):
        import json
        _os.write(fd, b'R ' + json.dumps(obj).encode() + b'\n')
    g = {'__name__': '__sandbox__', '__builtins__': __builtins__, '__sandbox_report__': report}
    code = compile(b''.join(chunks), 'main.py', 'exec')
    del chunks
    exec(code, g)
    _os.write(fd, ('%s %d\n' % (token, _os.getpid())).encode())
_sandbox_main()
"""


def harness_source(result_fd: int, token: str, block_sockets: bool) -> str:
    """The harness for one run: its sentinel `token`, written with the reports to
    `result_fd`; `block_sockets` installs the audit hook."""
    return (
        _WRAPPER.replace('@FD@', str(result_fd))
        .replace('@TOKEN@', repr(token))
        .replace('@BLOCK@', repr(bool(block_sockets)))
    )
