"""The seccomp deny-list of every sandbox, compiled to a BPF program with libseccomp.

Why libseccomp (through ctypes) rather than hand-written BPF: it knows the syscall numbers of
every architecture, adds the architecture check (a 32-bit `int 0x80` syscall on x86-64 is a
different table: libseccomp kills the process on a foreign architecture instead of letting it
bypass the list), and it is already on any machine that has bubblewrap (Debian's `libseccomp2`).
The program is built once per supervisor and handed to bubblewrap as bytes (`--seccomp FD`).

What it protects against: the kernel interfaces a sandboxed program has no business using and
that have a history of privilege escalations or let it tamper with the sandbox itself (ptrace
of bubblewrap's pid 1, reading another process's memory, new namespaces, mounts, keyrings,
BPF, io_uring, perf, userfaultfd, terminal injection). Denied calls fail with EPERM, so a
program that merely probes sees an error rather than a crash. What it does not do: it is a
deny-list, not an allow-list, so a kernel bug in an allowed syscall is not covered; it does not
limit resources (cgroups and rlimits do) or filesystem access (the mount namespace does).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

DENIED = (
    # debugging and cross-process memory access: tamper with bwrap's pid 1 or the fork-server
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # new namespaces and mounts (bwrap already drops capabilities; this closes the syscalls)
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
    # kernel attack surface with a history of escalations
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "add_key", "request_key", "keyctl", "vmsplice",
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "lookup_dcookie",
    # machine-wide operations (need capabilities anyway; denied to be sure)
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "iopl", "ioperm", "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl",
    "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "uselib",
)
TIOCSTI = 0x5412  # push characters into a terminal's input (CVE-2017-5226)
TIOCLINUX = 0x541C

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4


def SCMP_ACT_ERRNO(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class SeccompUnavailable(RuntimeError):
    pass


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise SeccompUnavailable(f"libseccomp is not installed ({e}); "
                                 "run `apt-get install libseccomp2`") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def build_bpf() -> bytes:
    """The deny-list as a raw BPF program (what `bwrap --seccomp FD` reads)."""
    lib = _lib()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    deny = SCMP_ACT_ERRNO(errno.EPERM)
    try:
        for name in DENIED:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a syscall on this architecture (e.g. iopl on arm64)
                continue
            rc = lib.seccomp_rule_add_array(ctx, deny, nr, 0, None)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp rule for {name}: {os.strerror(-rc)}")
        ioctl = lib.seccomp_syscall_resolve_name(b"ioctl")
        for request in (TIOCSTI, TIOCLINUX):
            cmp = (_ArgCmp * 1)(_ArgCmp(1, SCMP_CMP_EQ, request, 0))
            rc = lib.seccomp_rule_add_array(ctx, deny, ioctl, 1, cmp)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp rule for ioctl: {os.strerror(-rc)}")
        fd = os.memfd_create("posttrain-seccomp", os.MFD_CLOEXEC)
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise SeccompUnavailable(f"seccomp_export_bpf: {os.strerror(-rc)}")
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
