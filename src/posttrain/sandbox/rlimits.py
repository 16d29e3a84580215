"""The per-process rlimits of a sandbox, derived from `Limits`.

rlimits are the layer that is always there, cgroups or not. They are per *process* (a fork
bomb is stopped by the pids cgroup and NPROC, not by them), and RLIMIT_CPU does not catch a
sleeping process: the wall timeout does.
"""

from __future__ import annotations

import math
import resource

from posttrain.sandbox.base import Limits

MiB = 1 << 20


def rlimit_table(limits: Limits, *, memory_cgroup: bool, nproc_slack: int = 8,
                 cpu: bool = True) -> dict[int, tuple[int, int]]:
    """resource.RLIMIT_* -> (soft, hard).

    With a memory cgroup the cgroup is the memory limit (it counts what is resident, across
    processes, and reports an OOM kill), so RLIMIT_AS is only a loose backstop against one
    process mapping absurd amounts; without a cgroup, RLIMIT_AS *is* the memory limit.
    `cpu=False` leaves RLIMIT_CPU unset (the fork-server sets it per job instead, so its own
    idle lifetime does not eat the budget of the jobs).
    """
    mem = limits.memory_mb * MiB
    table = {
        resource.RLIMIT_AS: (2 * mem + 1024 * MiB) if memory_cgroup else mem,
        resource.RLIMIT_FSIZE: limits.file_mb * MiB,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_NPROC: limits.pids + nproc_slack,
        resource.RLIMIT_CORE: 0,
    }
    out = {k: (v, v) for k, v in table.items()}
    if cpu:
        cpu_s = max(1, int(round(limits.cpu_s)))
        # soft limit -> SIGXCPU (reported as reason "cpu"); the hard one a second later kills
        out[resource.RLIMIT_CPU] = (cpu_s, cpu_s + 1)
    return out


def apply_self(table: dict[int, tuple[int, int]]) -> None:
    for res, value in table.items():
        resource.setrlimit(res, value)


def thread_env(cpus: float) -> dict[str, str]:
    """Numerical libraries' thread pools sized to the sandbox's CPU quota (`Limits.cpus`, rounded
    up) rather than to the machine's cores: a pool wider than the quota only spins and yields
    (OpenBLAS busy-waits after every call) and is throttled by the cgroup. Without it a numpy
    grading program in a one-core sandbox spent ~8 % of a self-check's CPU in idle BLAS threads."""
    n = str(max(1, math.ceil(cpus)))
    return {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
