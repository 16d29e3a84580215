"""`isolation_layers()`: which isolation layers are active on this machine, and why not.

Used by `posttrain sandbox check` and recorded in `SandboxInfo.layers`. Each layer's meaning is
documented in `posttrain.sandbox.bwrap` (what it protects against, and what it does not).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    active: bool
    detail: str


def _overlay_supported() -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == "overlay" for line in f if line.strip())
    except OSError:
        return False


def isolation_layers() -> list[Layer]:
    from posttrain.sandbox.bwrap import INSTALL_HINT, bwrap_problem, find_bwrap, seccomp_program
    from posttrain.sandbox.cgroups import detect

    problem = bwrap_problem()
    ok = problem is None
    layers = [Layer("bubblewrap", ok, f"{find_bwrap()}" if problem is None else problem)]
    ns = "mount, pid, net, ipc, uts, cgroup, user (nested user namespaces disabled)"
    layers.append(Layer("namespaces", ok, ns if ok else "needs bubblewrap"))
    layers.append(Layer("no network", ok, "only an unconfigured loopback inside" if ok
                        else "needs bubblewrap"))
    layers.append(Layer("read-only root, no host files", ok,
                        "tmpfs root remounted read-only; /usr, /opt (interpreter) read-only; "
                        "no /etc, /root, /home or repository" if ok else "needs bubblewrap"))
    root = os.geteuid() == 0
    layers.append(Layer("unprivileged uid", ok and root,
                        "one unused host uid per sandbox, uid 1000 inside, no capabilities"
                        if ok and root else "needs bubblewrap and a root launcher"))
    layers.append(Layer("cleared environment", True,
                        "bubblewrap starts with an empty environment (nothing in /proc/1/environ)"
                        if ok else "process backend: a fixed, minimal environment"))
    bpf = seccomp_program() if ok else None
    layers.append(Layer("seccomp deny-list", bpf is not None,
                        f"{len(bpf)} bytes of BPF (libseccomp)" if bpf else
                        ("libseccomp missing: apt-get install libseccomp2" if ok
                         else "needs bubblewrap")))
    found = detect()
    for c in ("memory", "pids", "cpu"):
        if c in found:
            ver, mnt = found[c]
            layers.append(Layer(f"cgroup {c}", ok, f"cgroup {ver} at {mnt}"))
        else:
            layers.append(Layer(f"cgroup {c}", False, "no writable cgroup controller "
                                "(rlimits only)" if root else "needs root"))
    layers.append(Layer("rlimits", True, "address space, CPU, file size, open files, "
                        "processes, no core dumps"))
    layers.append(Layer("wall timeout and output caps", True,
                        "the supervisor kills the process tree; output kept up to a cap"))
    layers.append(Layer("tmpfs workspace", ok, "size-capped; a disk fill ends in ENOSPC" if ok
                        else "process backend: a plain temporary directory, uncapped"))
    ov = ok and _overlay_supported()
    layers.append(Layer("overlay snapshots", ov, "copy-on-write layers on tmpfs" if ov else
                        "process backend: snapshots are full copies"))
    if not ok and find_bwrap() is None:
        layers.append(Layer("install", False, INSTALL_HINT))
    return layers
