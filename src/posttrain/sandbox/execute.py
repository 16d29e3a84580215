"""Collecting one command's output under the wall timeout and the output caps.

Used by the supervisor for both the cold path (a new process per command) and the warm path (a
job forked by the fork-server). The loop keeps the first `output_bytes` of stdout and stderr,
counts the rest, and calls `kill` as soon as either stream passes `output_kill_bytes` (a 1 GB
flood is stopped after a few MiB, not read to the end) or the wall deadline passes. It never
decides *why* a process died beyond those two reasons; the caller adds what it knows (cgroup
counters, the exit status).
"""

from __future__ import annotations

import errno
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from posttrain.sandbox.base import Limits

DRAIN_GRACE_S = 0.2
"""after the command is known to be done, how long to wait for the pipes to reach EOF: a
background process it started (`server &`) may hold them open for as long as it runs; its
output after that is not collected"""


@dataclass
class Captured:
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    out_total: int = 0
    err_total: int = 0
    killed: str | None = None
    """"timeout" or "output" when this loop killed the command"""
    wall_s: float = 0.0


def pump(*, out_fd: int, err_fd: int, stdin_fd: int | None, stdin_data: bytes | None,
         done_fd: int, on_done: Callable[[], bool], kill: Callable[[], None], timeout: float,
         limits: Limits, hangup_fd: int | None = None) -> Captured:
    """Run the I/O loop until the command is done and its pipes are drained.

    `done_fd` becomes readable when the command finishes; `on_done()` is then called and
    returns True once the command is really over (False: spurious wake-up, keep going).
    `hangup_fd`, if given, is a socket whose closing means the host went away: the command is
    killed and EOFError raised. The caller owns (and closes) every descriptor passed in.
    """
    cap = Captured()
    start = time.monotonic()
    deadline = start + timeout
    poller = select.poll()
    streams = {out_fd: (cap.out, "out_total"), err_fd: (cap.err, "err_total")}
    for fd in streams:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    pending = memoryview(stdin_data or b"")
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        if pending:
            poller.register(stdin_fd, select.POLLOUT)
        else:
            os.close(stdin_fd)
            stdin_fd = None
    poller.register(done_fd, select.POLLIN)
    if hangup_fd is not None:
        poller.register(hangup_fd, select.POLLRDHUP)
    done = False
    drain_deadline = None
    open_streams = set(streams)
    try:
        while open_streams or not done:
            now = time.monotonic()
            if not done and now >= deadline and cap.killed is None:
                cap.killed = "timeout"
                kill()
                deadline = now + 5.0  # the kill itself must finish; a bound against a stuck reap
            elif not done and now >= deadline:
                raise TimeoutError("the command survived SIGKILL for 5 s")
            if done and drain_deadline is None:
                drain_deadline = now + DRAIN_GRACE_S
            if drain_deadline is not None and now >= drain_deadline:
                break  # something still holds the pipes open; the caller kills it
            limit = drain_deadline if done and drain_deadline is not None else deadline
            wait_ms = max(0, int((limit - now) * 1000)) + 1
            for fd, _ev in poller.poll(wait_ms):
                if fd in streams:
                    buf, total_attr = streams[fd]
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        poller.unregister(fd)
                        open_streams.discard(fd)
                        continue
                    total = getattr(cap, total_attr) + len(chunk)
                    setattr(cap, total_attr, total)
                    room = limits.output_bytes - len(buf)
                    if room > 0:
                        buf += chunk[:room]
                    if total > limits.output_kill_bytes and cap.killed is None:
                        cap.killed = "output"
                        kill()
                        # stop reading: the rest of the flood is not worth the CPU
                        for s in list(open_streams):
                            poller.unregister(s)
                        open_streams.clear()
                elif fd == stdin_fd:
                    try:
                        pending = pending[os.write(stdin_fd, pending[: 1 << 16]):]
                    except BlockingIOError:
                        continue
                    except OSError as e:  # the command closed stdin or died: not our error
                        if e.errno not in (errno.EPIPE, errno.EBADF):
                            raise
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(stdin_fd)
                        os.close(stdin_fd)
                        stdin_fd = None
                elif fd == done_fd and not done:
                    if on_done():
                        done = True
                        poller.unregister(done_fd)
                elif fd == hangup_fd:
                    kill()
                    raise EOFError("the host closed the control connection")
    finally:
        if stdin_fd is not None:
            os.close(stdin_fd)
    cap.wall_s = time.monotonic() - start
    return cap
