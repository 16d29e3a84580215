"""Message framing on the sockets between the host, a sandbox's supervisor and its fork-server.

Two formats, on purpose:

* host <-> supervisor: length-prefixed pickles. Both ends are posttrain's own code running
  outside the sandbox (the supervisor as root), so pickle is safe there and it carries bytes.
* supervisor -> job server: a length-prefixed `marshal`led dict plus file descriptors
  (SCM_RIGHTS); job server -> supervisor: fixed binary reports (`recv_report`). The job server
  lives *inside* the sandbox, next to untrusted code: what comes from it is parsed as numbers
  and text of fixed layouts, never unpickled or unmarshalled by the root supervisor. (Neither
  format needs a module import in the job server, which keeps its start-up short.)
"""

from __future__ import annotations

import marshal
import os
import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")
MAX_MESSAGE = 64 << 20
"""a larger frame means a corrupt or hostile peer; the connection is dropped"""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise EOFError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_MESSAGE:
        raise EOFError(f"frame of {size} bytes exceeds {MAX_MESSAGE}")
    return _recv_exact(sock, size)


def send_obj(sock: socket.socket, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv_obj(sock: socket.socket) -> dict[str, Any]:
    """One message between host and supervisor: always a dict (requests, replies, the config)."""
    obj = pickle.loads(_recv_frame(sock))
    if not isinstance(obj, dict):
        raise ValueError(f"malformed message: a {type(obj).__name__}, not a dict")
    return obj


def send_job(sock: socket.socket, job: dict, fds: list[int]) -> None:
    """Supervisor -> job server: a marshalled dict (trusted direction) and three descriptors
    riding on the first byte."""
    data = marshal.dumps(job)
    frame = _HEADER.pack(len(data)) + data
    socket.send_fds(sock, [frame[:1]], list(fds))
    sock.sendall(frame[1:])


# job server -> supervisor: (kind, payload length) then the payload. Fixed binary layouts, so
# that what comes from inside the sandbox is parsed as numbers and text, nothing else.
REPORT_HEADER = struct.Struct("!BI")
READY, DONE = 0, 2
DONE_BODY = struct.Struct("!qdq")  # wait status, CPU seconds, max RSS in KiB
MAX_READY_TEXT = 1 << 16
STARTED = struct.Struct("!q")
"""the job server writes each job's pid (as it sees it) to a separate "started" pipe right
after the fork. The supervisor does not poll that pipe (no wake-up per job); it reads it only
when it needs to know: did a server that died start the job? which process group to kill?"""


def recv_report(sock: socket.socket) -> tuple[int, object]:
    """One report from the job server: (READY, error text) or (DONE, (status, cpu_s,
    maxrss_kb)). Raises EOFError if the server is gone, ValueError if it is malformed."""
    kind, size = REPORT_HEADER.unpack(_recv_exact(sock, REPORT_HEADER.size))
    if kind == READY and size <= MAX_READY_TEXT:
        return kind, _recv_exact(sock, size).decode("utf-8", errors="replace")
    if kind == DONE and size == DONE_BODY.size:
        return kind, DONE_BODY.unpack(_recv_exact(sock, size))
    raise ValueError(f"malformed report from the job server (kind {kind}, {size} bytes)")


def read_started(fd: int) -> int | None:
    """The last pid on a (non-blocking) started pipe, or None if nothing was written since the
    last call."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    n = len(data) // STARTED.size
    return STARTED.unpack_from(data, (n - 1) * STARTED.size)[0] if n else None
