"""The abuse suite: hostile programs a sandbox must contain, shared by the tests
(`tests/test_sandbox_abuse.py`) and the benchmark (`benchmarks/sandbox.py`).

Each case starts a fresh sandbox with small limits, runs its attack, and checks from the host
that the attack failed *and* left nothing behind: a contained case returns `(True, detail)`.
After the case the sandbox is closed and the host checks that no process of the sandbox's uid
survived (background processes may outlive a command, never the sandbox). Only loopback
addresses are ever used (nothing is sent off this machine).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from posttrain.sandbox.base import LimitReason, Limits, Sandbox, WorkspacePathError

SMALL = Limits(wall_s=5, cpu_s=5, memory_mb=256, pids=32, file_mb=16, workspace_mb=32,
               output_bytes=1 << 16, output_kill_bytes=1 << 20)


def _py(sb: Sandbox, code: str, **kw):
    return sb.run(["python3", "-c", textwrap.dedent(code)], **kw)


def _root_inside(sb: Sandbox) -> bool:
    """An image sandbox: root inside its user namespace, over a writable copy of the image
    (`imageroot.py`). Writing its /etc or /usr is allowed there; what must hold is that nothing
    reaches the host and nothing of the host is readable."""
    return bool(sb.info.layers.get("root in a user namespace"))


def _host_digest(path: str) -> str:
    """What the sandbox must not be able to reproduce: a host file's bytes or a directory's
    names, hashed (empty: nothing there to leak)."""
    import hashlib

    try:
        data = (b"\n".join(sorted(n.encode() for n in os.listdir(path))) if os.path.isdir(path)
                else open(path, "rb").read())
    except OSError:
        return ""
    return hashlib.sha256(data).hexdigest() if data else ""


def _still_works(sb: Sandbox) -> tuple[bool, str]:
    r = sb.run("echo alive")
    return r.stdout == "alive\n", f"next command: {r.exit_code} {r.stdout!r} {r.stderr[-200:]!r}"


def fork_bomb(sb):
    r = _py(sb, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """, timeout=2)
    ok, after = _still_works(sb)
    return (r.limit in (LimitReason.TIMEOUT, LimitReason.PIDS) and ok,
            f"limit={r.limit}; {after}")


def memory_bomb(sb):
    r = _py(sb, """
        chunks = []
        while True:
            chunks.append(b"x" * (8 << 20))
        """)
    ok, after = _still_works(sb)
    return (not r.ok and r.limit in (LimitReason.MEMORY, None) and ok,
            f"limit={r.limit} exit={r.exit_code} peak={r.peak_memory_mb}; {after}")


def disk_fill(sb):
    r = _py(sb, """
        n = 0
        try:
            while True:
                with open(f"fill{n}", "wb") as f:
                    f.write(b"x" * (8 << 20))
                n += 1
        except OSError as e:
            print(e.errno, n)
        """)
    written = sum(len(sb.read_file(p)) for p in sb.list_files())
    full = r.stdout.split()[:1] == [str(errno.ENOSPC)]
    cap = sb.limits.workspace_mb
    return (full and written <= cap << 20,
            f"{r.stdout.strip()!r}: {written >> 20} MiB written in a {cap} MiB workspace")


def infinite_loop(sb):
    t = time.monotonic()
    r = _py(sb, "while True: pass", timeout=1)
    w = sb.run_python("while True: pass", timeout=1)
    took = time.monotonic() - t
    return (r.limit is LimitReason.TIMEOUT and w.limit is LimitReason.TIMEOUT and took < 10,
            f"cold {r.limit}, warm {w.limit}, {took:.1f} s")


def stdout_flood(sb):
    r = sb.run("head -c 1000000000 /dev/zero")
    return (r.limit is LimitReason.OUTPUT and len(r.stdout) <= sb.limits.output_bytes
            and r.stdout_truncated and r.wall_s < 10,
            f"limit={r.limit}, kept {len(r.stdout)} bytes, {r.wall_s:.2f} s")


def no_network(sb):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # on the host's loopback
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        r = _py(sb, f"""
            import socket
            print([name for _, name in socket.if_nameindex()])
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1)
                print("CONNECTED")
            except OSError as e:
                print("refused", e.errno)
            """)
        try:
            listener.accept()[0].close()
            accepted = True
        except TimeoutError:
            accepted = False
    finally:
        listener.close()
    return (r.stdout.startswith("['lo']") and "CONNECTED" not in r.stdout and not accepted,
            r.stdout.strip().replace("\n", "; "))


def host_files(sb):
    import posttrain

    package = os.path.abspath(posttrain.__file__)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(package)))
    targets = ["/etc/shadow", "/root", "/home", repo, package]
    r = _py(sb, f"""
        import hashlib, os
        for p in {targets!r}:
            try:
                if os.path.isdir(p):
                    data = "\\n".join(sorted(os.listdir(p))).encode()
                else:
                    data = open(p, "rb").read()
                print(p, hashlib.sha256(data).hexdigest() if data else "empty")
            except OSError as e:
                print(p, "denied", e.errno)
        """)
    # a leak is the host's own content (an image has its own /etc/shadow and /root: not a leak)
    host = {p: _host_digest(p) for p in targets}
    leaked = [line for line in r.stdout.splitlines()
              if host.get(line.split(" ")[0]) and line.split(" ")[-1] == host[line.split(" ")[0]]]
    return (r.ok and not leaked and len(r.stdout.splitlines()) == len(targets),
            "; ".join(r.stdout.splitlines()))


def write_outside(sb):
    marker = f"posttrain-abuse-{secrets.token_hex(4)}"
    paths = [f"/etc/{marker}", f"/usr/{marker}", f"/opt/{marker}", f"/{marker}",
             f"/dev/{marker}", "/proc/sys/kernel/hostname"]
    r = _py(sb, f"""
        for p in {paths!r}:
            try:
                open(p, "w").write("x")
                print(p, "WROTE")
            except OSError as e:
                print(p, "denied", e.errno)
        """)
    on_host = [p for p in paths if marker in p and os.path.exists(p)]
    wrote = [line.split(" ")[0] for line in r.stdout.splitlines() if line.endswith("WROTE")]
    if _root_inside(sb):  # its own copy of /etc, /usr, /opt and / may change; /dev, /proc not
        wrote = [p for p in wrote if p.startswith(("/dev/", "/proc/"))]
    return (r.ok and not wrote and not on_host, r.stdout.strip().replace("\n", "; "))


def env_secret(sb):
    # run_case plants POSTTRAIN_ABUSE_SECRET in the host's environment before the sandbox starts
    secret = os.environ.get("POSTTRAIN_ABUSE_SECRET", "")
    r = sb.run("env; cat /proc/1/environ /proc/self/environ /proc/*/environ 2>/dev/null; "
               "cat /proc/1/cmdline; true")
    w = sb.run_python("import os; print(dict(os.environ))")
    found = secret in r.stdout or secret in w.stdout
    return (bool(secret) and not found and r.ok, "LEAKED" if found else "secret not visible")


PTRACE = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    res = []
    for pid in (1, os.getppid()):
        rc = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
        res.append((pid, rc, ctypes.get_errno()))
    try:
        open("/proc/1/mem", "rb").read(1)
        res.append("MEM")
    except OSError as e:
        res.append(("mem", e.errno))
    print(res)
    """


def ptrace_anything(sb):
    r = _py(sb, PTRACE)
    w = sb.run_python(textwrap.dedent(PTRACE))
    bad = any("MEM" in x.stdout or ", 0, " in x.stdout for x in (r, w))
    return (r.ok and w.ok and not bad, f"cold {r.stdout.strip()} warm {w.stdout.strip()}")


def kill_parent(sb):
    a = sb.run("kill -9 $PPID; kill -9 1; kill -9 -1; true")
    b = sb.run_python(textwrap.dedent("""
        import os, signal
        for pid in (os.getppid(), 1, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        """))
    ok, after = _still_works(sb)
    w = sb.run_python("print('warm alive')")
    return (ok and w.stdout == "warm alive\n", f"{a.limit} {b.limit}; {after}")


def daemon(sb):
    r = sb.run("(setsid sh -c 'sleep 1; echo late > late.txt' &) ; echo started")
    w = sb.run_python(textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1)
                open("late2.txt", "w").write("late")
            os._exit(0)
        print("ok")
        """))
    killed = sb.kill_processes()  # what an environment does before grading
    time.sleep(1.5)
    files = sb.list_files()
    return (r.stdout == "started\n" and w.ok and killed >= 2 and "late.txt" not in files
            and "late2.txt" not in files, f"killed {killed}; workspace after 1.5 s: {files}")


def privilege_escalation(sb):
    sb.write_file("f.txt", "x")
    r = _py(sb, """
        import os, subprocess
        res = {}
        for name, fn in [("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                         ("chown", lambda: os.chown("f.txt", 0, 0))]:
            try:
                fn()
                res[name] = "ALLOWED"
            except OSError:
                res[name] = "denied"
        for name, argv in [("userns", ["unshare", "-Ur", "true"]),
                           ("mount", ["mount", "-t", "tmpfs", "x", "/tmp"]),
                           ("su", ["su", "-c", "true"])]:
            rc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL).returncode
            res[name] = "ALLOWED" if rc == 0 else "denied"
        status = open("/proc/self/status").read().splitlines()
        res["status"] = [s for s in status if s.startswith(("CapEff", "CapBnd", "NoNewPrivs"))]
        print(res)
        """)
    if _root_inside(sb):
        # root inside may setuid and chown among its own ids; namespaces and mounts stay shut,
        # and its ids are an unprivileged host range (its capabilities count only for those)
        from posttrain.sandbox.slots import RANGE_UID_BASE

        shut = all(f"'{k}': 'denied'" in r.stdout for k in ("userns", "mount"))
        host_uid = getattr(sb, "host_uid", None) or 0
        return (r.ok and shut and "NoNewPrivs:\\t1" in r.stdout and host_uid >= RANGE_UID_BASE,
                f"host uid {host_uid}; {r.stdout.strip()}")
    caps_zero = all(s in r.stdout for s in ("CapEff:\\t0000000000000000",
                                            "CapBnd:\\t0000000000000000", "NoNewPrivs:\\t1"))
    return r.ok and "ALLOWED" not in r.stdout and caps_zero, r.stdout.strip()


def path_escapes(sb):
    r = sb.run("ln -s /etc/hostname host && ln -s .. up && cat ../../etc/shadow; "
               "cat up/up/up/etc/shadow; true")
    refused = 0
    for path in ("host", "up/x", "../x", "/etc/passwd", "a/../../b"):
        for op in (lambda p: sb.read_file(p), lambda p: sb.write_file(p, "x")):
            try:
                op(path)
            except (WorkspacePathError, FileNotFoundError):
                refused += 1
    host_shadow = open("/etc/shadow").read() if os.path.exists("/etc/shadow") else "root:"
    leaked = (host_shadow.strip() in r.stdout) if _root_inside(sb) else ("root:" in r.stdout)
    return (refused == 10 and not leaked, f"{refused}/10 file-API calls refused")


def hostname(sb):
    before = socket.gethostname()
    r = sb.run("hostname evil 2>&1; echo evil > /proc/sys/kernel/hostname 2>&1; hostname")
    return (socket.gethostname() == before and r.stdout.strip().endswith("sandbox"),
            r.stdout.strip().replace("\n", "; "))


def fd_and_proc_leaks(sb):
    r = _py(sb, """
        import os
        print(sorted(os.listdir("/proc/self/fd")))
        print(len([p for p in os.listdir("/proc") if p.isdigit()]))
        """)
    fds, nprocs = (r.stdout.split("\n") + ["", "0"])[:2]
    # 3 is listdir's own descriptor; the processes are the job server (pid 1) and this one
    return (fds in ("['0', '1', '2']", "['0', '1', '2', '3']") and 0 < int(nprocs) <= 4,
            f"fds {fds}, {nprocs} processes visible")


@dataclass(frozen=True)
class AbuseCase:
    name: str
    run: Callable[[Sandbox], tuple[bool, str]]
    limits: Limits = field(default=SMALL)


CASES = [
    AbuseCase("fork bomb", fork_bomb),
    AbuseCase("memory bomb (64 MiB cap)", memory_bomb, Limits(
        wall_s=10, memory_mb=64, pids=32, output_bytes=1 << 16, output_kill_bytes=1 << 20)),
    AbuseCase("disk fill", disk_fill, Limits(wall_s=10, file_mb=64, workspace_mb=32)),
    AbuseCase("infinite loop", infinite_loop),
    AbuseCase("1 GB of stdout", stdout_flood),
    AbuseCase("no network", no_network),
    AbuseCase("read host files", host_files),
    AbuseCase("write outside the workspace", write_outside),
    AbuseCase("parent's secret environment", env_secret),
    AbuseCase("ptrace", ptrace_anything),
    AbuseCase("kill the parent", kill_parent),
    AbuseCase("daemon outliving its command", daemon),
    AbuseCase("setuid/chown escalation", privilege_escalation),
    AbuseCase("symlink and .. escapes", path_escapes),
    AbuseCase("change the hostname", hostname),
    AbuseCase("fd and /proc leaks", fd_and_proc_leaks),
]


@dataclass
class AbuseOutcome:
    name: str
    contained: bool
    detail: str
    seconds: float


def run_case(case: AbuseCase, open_sandbox: Callable[[Limits], Sandbox]) -> AbuseOutcome:
    """Run one case in a fresh sandbox; afterwards no process of the sandbox may survive."""
    from posttrain.sandbox.slots import kill_uid

    t0 = time.monotonic()
    os.environ["POSTTRAIN_ABUSE_SECRET"] = "s3cr3t-" + secrets.token_hex(8)
    sb = None
    try:
        sb = open_sandbox(case.limits)
        contained, detail = case.run(sb)
    except Exception as e:  # a broken sandbox or an escape-check error: not contained
        contained, detail = False, f"{type(e).__name__}: {e}"
    finally:
        os.environ.pop("POSTTRAIN_ABUSE_SECRET", None)
        uid = getattr(sb, "host_uid", None)
        count = getattr(sb, "host_uid_count", 1)
        if sb is not None:
            sb.close()
    if uid is not None:
        survivors = kill_uid(uid, count)
        if survivors:
            contained, detail = False, f"{survivors} processes survived close; {detail}"
    return AbuseOutcome(case.name, contained, detail, time.monotonic() - t0)


def run_all(open_sandbox: Callable[[Limits], Sandbox]) -> list[AbuseOutcome]:
    """Every case, then a check that a new sandbox after all of them is normal."""
    outcomes = [run_case(c, open_sandbox) for c in CASES]
    sb = open_sandbox(Limits())
    try:
        ok, detail = _still_works(sb)
    finally:
        sb.close()
    outcomes.append(AbuseOutcome("next sandbox is normal", ok, detail, 0.0))
    return outcomes
