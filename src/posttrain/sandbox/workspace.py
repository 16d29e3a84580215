"""Host-side file operations on a sandbox workspace, safe against symlink and `..` escapes.

The host reaches the workspace through a path (for bubblewrap sandboxes, through
`/proc/<supervisor>/root/...`, which lands in the supervisor's private mount namespace). Every
path is walked one component at a time from a directory descriptor with `O_NOFOLLOW`, so a
symlink planted by the sandbox is never followed by the kernel on the host's behalf. Symlinks
are resolved here instead, and only while they stay inside the workspace (an absolute target is
read as a path inside the sandbox, e.g. `/ws/a` -> `a`); anything else raises
`WorkspacePathError`. Renaming a directory between two steps cannot redirect the walk either,
because each step starts from the descriptor of the previous one.

What this does not do: it does not lock the workspace. Call it between commands, not while a
command in the same sandbox is rewriting the same files.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable

from posttrain.sandbox.base import WorkspacePathError

_MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split_workspace_path(path: object, *, allow_root: bool = False) -> list[str]:
    """Check a caller-given workspace path and return its components."""
    if not isinstance(path, str):
        raise WorkspacePathError(f"workspace path must be a str, got {type(path).__name__}")
    if "\0" in path:
        raise WorkspacePathError(f"workspace path contains a NUL byte: {path!r}")
    if path.startswith("/"):
        raise WorkspacePathError(f"workspace path must be relative, got absolute {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspacePathError(f"workspace path must not contain '..': {path!r}")
    if not parts and not allow_root:
        raise WorkspacePathError(f"workspace path names no file: {path!r}")
    return parts


def _check_mode(op: str, path: str, mode: object, owner: tuple[int, int] | None) -> None:
    if not (isinstance(mode, int) and 0 <= mode <= 0o7777):
        raise ValueError(f"{op}({path!r}): mode must be within 0o0000..0o7777 (setuid, setgid "
                         f"and sticky included), got {mode!r}")
    if mode & 0o6000 and owner is None:
        # without a sandbox uid the file would be the host user's (root's): a setuid binary on
        # the host. With one it is that unprivileged uid's, on a nosuid mount.
        raise ValueError(f"{op}({path!r}): setuid/setgid bits ({mode:#o}) need a sandbox with its "
                         "own uid (the bubblewrap backend); this one writes as the host's user")


class Workspace:
    """File access to one workspace directory. `root` is called on every operation (the
    directory behind it changes when the sandbox restores a snapshot)."""

    def __init__(self, root: Callable[[], str], *, owner: tuple[int, int] | None = None,
                 inside_path: str = "/ws") -> None:
        self._root = root
        self._owner = owner
        self._inside = inside_path.rstrip("/")

    # -- walking -------------------------------------------------------------------------
    def _resolve(self, path: str, parts: list[str], *, create_dirs: bool = False,
                 final_dir: bool = False) -> tuple[int, str | None, list[str]]:
        """Walk `parts` from the root. Returns (descriptor of the parent directory, final name,
        resolved components). With final_dir, the final component is entered too and the name
        is None. The caller closes the descriptor."""
        root_fd = os.open(self._root(), _DIR_FLAGS)
        stack = [root_fd]
        names: list[str] = []
        queue = list(parts)
        hops = 0
        try:
            while queue:
                name = queue.pop(0)
                if name in ("", "."):
                    continue
                if name == "..":  # only reachable through a symlink target
                    if not names:
                        raise WorkspacePathError(f"{path!r}: a symlink leads out of the workspace")
                    os.close(stack.pop())
                    names.pop()
                    continue
                is_last = not queue
                try:
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if is_last and not final_dir:
                        return stack.pop(), name, names + [name]
                    if not create_dirs:
                        raise FileNotFoundError(f"no such file or directory in the workspace: "
                                                f"{path!r}") from None
                    os.mkdir(name, 0o755, dir_fd=stack[-1])
                    if self._owner:
                        os.chown(name, *self._owner, dir_fd=stack[-1], follow_symlinks=False)
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > _MAX_SYMLINKS:
                        raise WorkspacePathError(f"{path!r}: too many levels of symlinks")
                    target = os.readlink(name, dir_fd=stack[-1])
                    if target.startswith("/"):
                        if target != self._inside and not target.startswith(self._inside + "/"):
                            raise WorkspacePathError(
                                f"{path!r}: symlink {name!r} -> {target!r} leaves the workspace")
                        target = target[len(self._inside):]
                        while len(stack) > 1:
                            os.close(stack.pop())
                        names.clear()
                    queue[:0] = target.split("/")
                    continue
                if is_last and not final_dir:
                    return stack.pop(), name, names + [name]
                if not stat.S_ISDIR(st.st_mode):
                    raise NotADirectoryError(f"not a directory in the workspace: {path!r}")
                stack.append(os.open(name, _DIR_FLAGS, dir_fd=stack[-1]))
                names.append(name)
            return stack.pop(), None, names
        finally:
            for fd in stack:
                os.close(fd)

    # -- the file API --------------------------------------------------------------------
    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write_file({path!r}): data must be str or bytes, "
                            f"got {type(data).__name__}")
        _check_mode("write_file", path, mode, self._owner)
        parent, name, _ = self._resolve(path, split_workspace_path(path), create_dirs=True)
        assert name is not None  # without final_dir there is always a final name
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=parent)
        finally:
            os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WorkspacePathError(f"{path!r} exists and is not a regular file")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._owner:
                os.fchown(fd, *self._owner)
            os.fchmod(fd, mode)  # after the chown, which clears setuid/setgid
        finally:
            os.close(fd)

    def make_dir(self, path: str, mode: int = 0o755) -> None:
        """Create directory `path` (and missing parents), or set the mode of an existing one."""
        _check_mode("make_dir", path, mode, self._owner)
        fd, _, _ = self._resolve(path, split_workspace_path(path), create_dirs=True,
                                 final_dir=True)
        try:  # an O_PATH descriptor: change it through /proc, never by a path the sandbox can swap
            if self._owner:
                os.chown(f"/proc/self/fd/{fd}", *self._owner)
            os.chmod(f"/proc/self/fd/{fd}", mode)
        finally:
            os.close(fd)

    def make_symlink(self, path: str, target: str) -> None:
        """Create (or replace) the symbolic link `path` -> `target`; the host never follows it."""
        if not isinstance(target, str) or not target or "\0" in target:
            raise ValueError(f"make_symlink({path!r}): target must be a non-empty str, got {target!r}")
        parent, name, _ = self._resolve(path, split_workspace_path(path), create_dirs=True)
        assert name is not None
        try:
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_ISDIR(st.st_mode):
                    raise WorkspacePathError(f"{path!r} exists and is a directory")
                os.unlink(name, dir_fd=parent)
            os.symlink(target, name, dir_fd=parent)
            if self._owner:
                os.chown(name, *self._owner, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)

    def read_file(self, path: str) -> bytes:
        parent, name, _ = self._resolve(path, split_workspace_path(path))
        assert name is not None  # without final_dir there is always a final name
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=parent)
        except FileNotFoundError:
            raise FileNotFoundError(f"no such file in the workspace: {path!r}") from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(f"not a regular file in the workspace: {path!r}")
            return f.read()

    def list_files(self, path: str = ".") -> list[str]:
        parts = split_workspace_path(path, allow_root=True)
        dirfd, _, names = self._resolve(path, parts, final_dir=True)
        prefix = "/".join(names)
        out: list[str] = []
        try:
            for top, _dirs, files, topfd in os.fwalk(".", dir_fd=dirfd, follow_symlinks=False):
                for f in files:
                    if stat.S_ISREG(os.stat(f, dir_fd=topfd, follow_symlinks=False).st_mode):
                        rel = os.path.normpath(os.path.join(prefix, top, f))
                        out.append(rel)
        finally:
            os.close(dirfd)
        return sorted(out)

    def archive(self) -> bytes:
        """A deterministic tar of the workspace: sorted entries, mtime 0, owner 0, modes kept;
        regular files, directories and symlinks (other kinds are skipped)."""
        buf = io.BytesIO()
        dirfd, _, _ = self._resolve(".", [], final_dir=True)
        try:
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for top, dirs, files, topfd in os.fwalk(".", dir_fd=dirfd, follow_symlinks=False):
                    dirs.sort()
                    for name in sorted(dirs + files):
                        st = os.stat(name, dir_fd=topfd, follow_symlinks=False)
                        info = tarfile.TarInfo(os.path.normpath(os.path.join(top, name)))
                        info.mode, info.mtime = stat.S_IMODE(st.st_mode), 0
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        if stat.S_ISDIR(st.st_mode):
                            info.type = tarfile.DIRTYPE
                            tar.addfile(info)
                        elif stat.S_ISLNK(st.st_mode):
                            info.type = tarfile.SYMTYPE
                            info.linkname = os.readlink(name, dir_fd=topfd)
                            tar.addfile(info)
                        elif stat.S_ISREG(st.st_mode):
                            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                         dir_fd=topfd)
                            with os.fdopen(fd, "rb") as f:
                                data = f.read()
                            info.size = len(data)
                            tar.addfile(info, io.BytesIO(data))
        finally:
            os.close(dirfd)
        return buf.getvalue()
