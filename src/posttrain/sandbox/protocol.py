"""Message framing on the sockets between the host, a sandbox's supervisor and its fork-server.

Two formats, on purpose:

* host <-> supervisor: length-prefixed pickles. Both ends are posttrain's own code running
  outside the sandbox (the supervisor as root), so pickle is safe there and it carries bytes.
* supervisor <-> fork-server: length-prefixed JSON, plus file descriptors (SCM_RIGHTS). The
  fork-server lives *inside* the sandbox, next to untrusted code; whatever comes from it is
  parsed as plain data and checked, never unpickled by the root supervisor.
"""

from __future__ import annotations

import array
import json
import pickle
import socket
import struct

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


def recv_obj(sock: socket.socket) -> object:
    return pickle.loads(_recv_frame(sock))


def send_json(sock: socket.socket, obj: object, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    frame = _HEADER.pack(len(data)) + data
    if fds:
        # the descriptors ride on the first byte; the rest follows as ordinary stream data
        socket.send_fds(sock, [frame[:1]], list(fds))
        sock.sendall(frame[1:])
    else:
        sock.sendall(frame)


def recv_json(sock: socket.socket, max_fds: int = 0) -> tuple[object, list[int]]:
    """Receive one JSON frame and the descriptors sent with it (at most `max_fds`)."""
    fds: list[int] = []
    if max_fds:
        fdsize = array.array("i").itemsize
        first, ancdata, _flags, _addr = sock.recvmsg(1, socket.CMSG_SPACE(max_fds * fdsize))
        if not first:
            raise EOFError("peer closed the connection")
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(data[: len(data) - (len(data) % fdsize)])
                fds.extend(arr)
        head = first + _recv_exact(sock, _HEADER.size - 1)
    else:
        head = _recv_exact(sock, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise EOFError(f"frame of {size} bytes exceeds {MAX_MESSAGE}")
    return json.loads(_recv_exact(sock, size)), fds
