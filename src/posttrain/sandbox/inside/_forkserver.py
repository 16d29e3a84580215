"""posttrain's fork-server: how every command of a sandbox starts.

It runs *inside* the sandbox, under the sandbox's uid, namespaces, seccomp filter, cgroup and
rlimits. It imports the modules named on its command line once, then waits for jobs on its
control socket (fd given as argv[1]). Each job arrives as a JSON frame with three descriptors
(stdin, stdout, stderr pipes owned by the supervisor); the server forks, and the child either
execs an argv (`Sandbox.run`: a fresh process, as cold as any exec) or runs Python source as
`__main__` the way `python -c` would (`Sandbox.run_python`: the warm path, with the preloaded
modules already imported). The server reports the exit status and rusage; background processes
the job started keep running (the supervisor kills them on request, on a timeout, at the end).
Starting commands from here instead of launching a new bubblewrap per command saves the
namespace setup (5-20 ms) on every command.

What it protects against, and what not: a job is a separate process with its own fresh CPU
limit and a fresh random seed, and it cannot reach the control socket (closed in the child) or
the server's memory (the server is non-dumpable, so `/proc/<server>/mem` is closed to the job).
It shares the uid with the server, yet cannot kill it: under bubblewrap the server is its pid
namespace's pid 1 (`--as-pid-1`), which the kernel shields from every signal sent from inside for
which it has no handler (SIGKILL and SIGSTOP included), so a `kill -9 -1` kills the job's fellows
but not the server, and costs no restart. As pid 1 it also reaps the orphans reparented to it
(`_reap`). If the server dies anyway (the OOM killer, a kill from the host), its namespace dies
with it; the supervisor notices and starts a new one. Jobs of one sandbox share its workspace and
`/tmp`; a fork-server is never reused across sandboxes (episodes).

This file is self-contained (stdlib only) because the `posttrain` package is not visible inside
the sandbox, and it imports only built-in modules (`_socket`, `marshal`, `struct`, ...) so that it
is ready in a few tens of milliseconds; the wire format is described in `protocol.py`.
"""

import _socket
import builtins
import gc
import marshal
import os
import resource
import signal
import struct
import sys

_HEADER = struct.Struct("!I")
_REPORT = struct.Struct("!BI")
_READY, _DONE = 0, 2
_STARTED = struct.Struct("!q")
_DONE_BODY = struct.Struct("!qdq")
_PR_SET_DUMPABLE = 4
_FD = struct.Struct("i")

_libc: "ctypes.CDLL | None"
try:
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True)
except (ImportError, OSError):  # no ctypes/libc: the server stays dumpable (weaker, see above)
    _libc = None


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_job(sock):
    first, anc, _flags, _addr = sock.recvmsg(1, _socket.CMSG_SPACE(3 * _FD.size))
    if not first:
        raise EOFError
    fds = []
    for level, kind, data in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [_FD.unpack_from(data, i)[0] for i in range(0, len(data) - 3, _FD.size)]
    (size,) = _HEADER.unpack(first + _recv_exact(sock, _HEADER.size - 1))
    return marshal.loads(_recv_exact(sock, size)), fds


def _report(sock, kind, body=b""):
    sock.sendall(_REPORT.pack(kind, len(body)) + body)


def _set_dumpable(flag):
    if _libc is not None:
        _libc.prctl(_PR_SET_DUMPABLE, flag, 0, 0, 0)


def _keep_caps_to_self():
    """In a two-uid sandbox (POSTTRAIN_CANDIDATE_UID set) the server starts with the grader's
    capabilities as ambient ones. Clear the inheritable set (and so the ambient one): every job
    forked from here keeps them in its own process, but nothing a job execs inherits them."""
    if _libc is None or not os.environ.get("POSTTRAIN_CANDIDATE_UID"):
        return
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} x 2 words
    if _libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    data[2] = data[5] = 0
    if _libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


_INIT = os.getpid() == 1
"""the server is its pid namespace's init (bubblewrap's --as-pid-1): it reaps the orphans"""
_busy = False
"""a job is running: its exit is the main loop's to collect (with its rusage), not `_reap`'s"""


def _reap(*_):
    """SIGCHLD as pid 1, between jobs: reap the exited orphans (the background processes of
    earlier jobs), which would otherwise stay zombies (they count against RLIMIT_NPROC, and a
    reset waits for every process of the sandbox to be gone)."""
    while not _busy:
        try:
            if os.wait4(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _wait_job(pid):
    """The job's (status, rusage); as pid 1, the orphans that exit meanwhile are reaped too."""
    global _busy
    if not _INIT:
        return os.wait4(pid, 0)[1:]
    try:
        while True:
            got, status, ru = os.wait4(-1, 0)
            if got == pid:
                return status, ru
    finally:
        _busy = False
        _reap()  # what exited while the job ran, after its last wait4


def _become_job(msg, fds, sock):
    """In the forked child: stdio, session, CPU limit, working directory."""
    if _INIT:  # the server's own signal dispositions are not a job's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sock.close()  # the child keeps no way to talk to the supervisor (closerange below, too)
    os.setsid()  # its own session and process group: signals to its group stay in the job
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    os.closerange(3, 1 << 16)
    cpu = int(msg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # a fresh budget for each job
    _set_dumpable(1)
    os.chdir(msg["cwd"])


def _exec_job(msg, fds, sock):
    """Run an argv (`Sandbox.run`): exec it like a shell would; never return."""
    status = 127
    try:
        _become_job(msg, fds, sock)
        # Python ignores SIGPIPE and SIGXFSZ; an exec'd program must get the defaults back
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        env = dict(os.environ)
        env.update(msg.get("env") or {})
        argv = msg["argv"]
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            status = 127 if isinstance(e, FileNotFoundError) else 126
            os.write(2, f"posttrain: cannot execute {argv[0]!r}: {e.strerror}\n".encode())
    finally:
        os._exit(status)


def _run_job(msg, fds, sock):
    """Run Python source (`Sandbox.run_python`) as `__main__`, like `python -c`."""
    status = 1
    try:
        _become_job(msg, fds, sock)
        sys.argv = ["-c", *msg["args"]]
        if "random" in sys.modules:
            sys.modules["random"].seed()
        main = type(sys)("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        try:
            code = msg.get("compiled") or compile(msg["code"], "<string>", "exec")
            exec(code, main.__dict__)
            status = 0
        except SystemExit as e:
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                status = 1
        except BaseException:
            sys.excepthook(*sys.exc_info())  # the interpreter's own traceback printer
            status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(status)


_COMPILED = {}  # type: dict[str, object]
_COMPILED_MAX = 16


def _compiled(source):
    """The code object of a program the host marked as its own (`cache`: a grading program, the
    same text every grade), compiled once here and inherited by every fork: a grading program
    of a few hundred lines costs 3-5 ms to compile. Only the host's own programs are marked,
    never the policy's code; a code object is immutable, and every job still runs it in a fresh
    `__main__` of its own process, so nothing of one job reaches the next. None: let the job
    compile it (and report the error itself)."""
    code = _COMPILED.get(source)
    if code is None:
        try:
            code = compile(source, "<string>", "exec")
        except Exception:
            return None
        if len(_COMPILED) >= _COMPILED_MAX:
            del _COMPILED[next(iter(_COMPILED))]
        _COMPILED[source] = code
    return code


def main():
    # argv: control socket fd, started pipe fd, preload modules (a,b,c)
    sock = _socket.socket(fileno=int(sys.argv[1]))
    started = int(sys.argv[2])
    os.set_blocking(started, False)
    preload = [m for m in sys.argv[3].split(",") if m] if len(sys.argv) > 3 else []
    _set_dumpable(0)
    _keep_caps_to_self()
    if _INIT:
        # Python's SIGINT handler would let a job's `kill -INT 1` stop the server: with the
        # default disposition the kernel drops it, as it does every signal sent to pid 1 from
        # inside that has no handler
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, _reap)
    errors = []
    for name in preload:
        try:
            __import__(name)
        except BaseException:
            import traceback

            errors.append(f"{name}: {traceback.format_exc(limit=3)}")
    os.chdir("/")
    # The first compile() of a process initialises the compiler's tables (~2-5 ms): do it once
    # here rather than in every job. Then move every object imported so far out of the
    # collector's reach: otherwise the first collection in a job walks (and so writes to) the
    # whole inherited heap, and copy-on-write duplicates it page by page.
    compile("pass", "<string>", "exec")
    gc.collect()
    gc.freeze()
    _report(sock, _READY, "\n".join(errors).encode()[:60000])
    global _busy
    while True:
        try:
            msg, fds = _recv_job(sock)
        except (EOFError, OSError):
            os._exit(0)
        if msg.get("cache") and "code" in msg:
            msg["compiled"] = _compiled(msg["code"])
        _busy = True  # before the fork: a job that exits at once is still the main loop's
        pid = os.fork()
        if pid == 0:
            (_exec_job if "argv" in msg else _run_job)(msg, fds, sock)
        for fd in fds:
            os.close(fd)
        # "started", on a pipe the supervisor does not poll: from here on the job may have
        # run (it is retried only if the server died before this); the process backend also
        # kills a timed-out job's process group by this pid
        try:
            os.write(started, _STARTED.pack(pid))
        except OSError:
            pass
        # What the job left running in the background (`server &`) stays, as in a shell, until
        # the supervisor's kill_processes() or the sandbox's end. Orphans go to pid 1: this
        # server under bubblewrap (reaped in `_wait_job` and `_reap`), else the process backend's
        # supervisor.
        status, ru = _wait_job(pid)
        _report(sock, _DONE, _DONE_BODY.pack(status, ru.ru_utime + ru.ru_stime, ru.ru_maxrss))


if __name__ == "__main__":
    main()
