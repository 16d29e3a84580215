"""Episode ids: unique, 32 hex digits, short prefixes that tell them apart, and never repeated by a
forked child."""

from __future__ import annotations

import os
import re

from posttrain.rollout.episode import _IDS


def test_ids_are_unique_hex_of_uuid_length_and_their_prefixes_differ():
    ids = [_IDS.new() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # the store and the CLI take a unique prefix of an id (`posttrain replay RUN 60a7c9e5f9`)
    assert len({i[:10] for i in ids}) == len(ids)


def test_a_forked_child_draws_its_own_ids():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(w, _IDS.new().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    parent = _IDS.new()
    assert re.fullmatch(r"[0-9a-f]{32}", child)
    assert child != parent  # without a fresh seed the child would draw the parent's next id
