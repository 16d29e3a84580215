"""The directory a sandbox shows at /opt/posttrain/inside: the job server (`inside/`) plus the
module files its user brought.

A preload entry is a module name (`numpy`: the warm interpreter imports it) or the host path of
a Python file (`/…/ptgeo.py`): that file is shown as `/opt/posttrain/inside/<name>.py`, on the
sandbox's `PYTHONPATH`, and imported up front like a named module. It is how an API that a task
family's tools use (e.g. geometry's `ptgeo`) reaches the sandbox while this package knows
nothing of families. Tracebacks inside the sandbox name the file at that path, whichever host
directory it came from.

Each distinct set of files is copied once per process into a temporary directory (readable by
the sandboxes' uids, removed at exit); a sandbox with no module files shows `inside/` itself.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

INSIDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inside")
"""the job server and its helpers, shown to every sandbox"""

_lock = threading.Lock()
_made: dict[tuple[tuple[str, str], ...], str] = {}


def is_module_file(entry: str) -> bool:
    """Whether a preload entry names a module file (an absolute path ending in .py)."""
    return os.path.isabs(entry) and entry.endswith(".py")


def module_file_name(path: str) -> str:
    """The module name a module file is imported as inside (`/x/ptgeo.py` -> `ptgeo`)."""
    return os.path.basename(path)[:-3]


def check_module_file(path: str) -> None:
    """ValueError naming `path` when it cannot be shown inside."""
    name = module_file_name(path)
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"preload: module file {path!r}: {name!r} is not a public module name")
    if os.path.exists(os.path.join(INSIDE_DIR, name + ".py")):
        raise ValueError(f"preload: module file {path!r} would hide the sandbox's own {name}.py")
    if not os.path.isfile(path):
        raise ValueError(f"preload: module file {path!r} does not exist")


def split_preload(preload: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """(the module names the warm interpreter imports, the module files shown inside)."""
    files = tuple(sorted({p for p in preload if is_module_file(p)}))
    names = [p for p in preload if not is_module_file(p)]
    names += [module_file_name(p) for p in files if module_file_name(p) not in names]
    return names, files


def inside_dir(files: Sequence[str]) -> str:
    """The host directory to show at /opt/posttrain/inside for a sandbox with `files`."""
    if not files:
        return INSIDE_DIR
    names = [module_file_name(p) for p in files]
    if len(set(names)) != len(names):
        raise ValueError(f"preload: two module files share a name: {sorted(files)}")
    contents = {}
    for path in files:
        with open(path, "rb") as f:
            contents[module_file_name(path) + ".py"] = f.read()
    # keyed by content: an edited file (a developer's change) gets a directory of its own
    key = tuple(sorted((n, hashlib.sha256(b).hexdigest()) for n, b in contents.items()))
    with _lock:
        if key in _made and os.path.isdir(_made[key]):
            return _made[key]
        where = tempfile.mkdtemp(prefix="posttrain-inside-")
        atexit.register(shutil.rmtree, where, True)
        for name in os.listdir(INSIDE_DIR):
            if os.path.isfile(os.path.join(INSIDE_DIR, name)):
                shutil.copyfile(os.path.join(INSIDE_DIR, name), os.path.join(where, name))
        for name, body in contents.items():
            with open(os.path.join(where, name), "wb") as f:
                f.write(body)
        for name in os.listdir(where):
            os.chmod(os.path.join(where, name), 0o644)
        os.chmod(where, 0o755)  # the sandboxes run as other uids
        _made[key] = where
        return where
