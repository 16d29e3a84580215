"""The abuse suite: hostile programs a sandbox must contain, shared by the tests
(`tests/test_sandbox_abuse.py`) and the benchmark (`benchmarks/sandbox.py`).

Each case starts a fresh sandbox with small limits, runs its attack, and checks from the host
that the attack failed *and* left nothing behind: a contained case returns `(True, detail)`.
After the case the sandbox is closed and the host checks that no process of the sandbox's uid
survived. Only loopback addresses are ever used (nothing is sent off this machine).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from posttrain.sandbox.base import LimitReason, Limits, Sandbox, WorkspacePathError

SMALL = Limits(wall_s=5, cpu_s=5, memory_mb=256, pids=32, file_mb=16, workspace_mb=32,
               output_bytes=1 << 16, output_kill_bytes=1 << 20)


def _py(sb: Sandbox, code: str, **kw):
    return sb.run(["python3", "-c", code], **kw)


def _still_works(sb: Sandbox) -> tuple[bool, str]:
    r = sb.run("echo alive")
    return r.stdout == "alive\n", f"next command: {r.exit_code} {r.stdout!r} {r.stderr[-200:]!r}"


def fork_bomb(sb):
    r = _py(sb, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                "        pass", timeout=2)
    ok, after = _still_works(sb)
    return (r.limit in (LimitReason.TIMEOUT, LimitReason.PIDS) and ok,
            f"limit={r.limit}; {after}")


def memory_bomb(sb):
    r = _py(sb, "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))")
    ok, after = _still_works(sb)
    return (not r.ok and r.limit in (LimitReason.MEMORY, None) and ok,
            f"limit={r.limit} exit={r.exit_code} peak={r.peak_memory_mb}; {after}")


def disk_fill(sb):
    r = _py(sb, "import os\nn = 0\ntry:\n    while True:\n"
                "        with open(f'fill{n}', 'wb') as f:\n            f.write(b'x' * (8 << 20))\n"
                "        n += 1\nexcept OSError as e:\n    print(e.errno, n)")
    written = sum(len(sb.read_file(p)) for p in sb.list_files())
    full = r.stdout.split()[:1] == ["28"]  # ENOSPC
    return (full and written <= sb.limits.workspace_mb << 20,
            f"{r.stdout.strip()!r}: {written >> 20} MiB in a {sb.limits.workspace_mb} MiB workspace")


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
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        r = _py(sb, "import socket\nprint([n for _, n in socket.if_nameindex()])\n"
                    f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                    "    print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)")
        try:
            listener.accept()[0].close()
            accepted = True
        except socket.timeout:
            accepted = False
    finally:
        listener.close()
    return (r.stdout.startswith("['lo']") and "CONNECTED" not in r.stdout and not accepted,
            r.stdout.strip())


def host_files(sb):
    import posttrain

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(posttrain.__file__))))
    targets = ["/etc/shadow", "/root", "/home", repo, os.path.abspath(posttrain.__file__)]
    code = ("import os\nfor p in %r:\n    try:\n        print(p, 'LISTED' if os.path.isdir(p) "
            "and os.listdir(p) else ('READ' if open(p, 'rb').read() else 'EMPTY'))\n"
            "    except OSError as e:\n        print(p, 'denied', e.errno)" % (targets,))
    r = _py(sb, code)
    leaked = [line for line in r.stdout.splitlines() if line.endswith(("LISTED", "READ"))]
    return (r.ok and not leaked and len(r.stdout.splitlines()) == len(targets),
            "; ".join(r.stdout.splitlines()))


def write_outside(sb):
    marker = f"posttrain-abuse-{secrets.token_hex(4)}"
    paths = [f"/etc/{marker}", f"/usr/{marker}", f"/opt/{marker}", f"/{marker}",
             "/proc/sys/kernel/hostname", f"/dev/{marker}"]
    code = ("for p in %r:\n    try:\n        open(p, 'w').write('x')\n        print(p, 'WROTE')\n"
            "    except OSError as e:\n        print(p, 'denied', e.errno)" % (paths,))
    r = _py(sb, code)
    on_host = [p for p in paths if os.path.exists(p) and marker in p]
    return (r.ok and "WROTE" not in r.stdout and not on_host, r.stdout.strip().replace("\n", "; "))


def env_secret(sb):
    # run_case plants POSTTRAIN_ABUSE_SECRET in the host's environment before the sandbox starts
    secret = os.environ.get("POSTTRAIN_ABUSE_SECRET", "")
    r = sb.run("env; cat /proc/1/environ /proc/self/environ /proc/*/environ 2>/dev/null; "
               "cat /proc/1/cmdline; true")
    w = sb.run_python("import os; print(dict(os.environ))")
    found = secret in r.stdout or secret in w.stdout
    return (bool(secret) and not found and r.ok, "LEAKED" if found else "secret not visible")


def ptrace_anything(sb):
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nres = []\n"
            "for pid in (1, os.getppid()):\n    rc = libc.ptrace(16, pid, 0, 0)\n"
            "    res.append((pid, rc, ctypes.get_errno()))\n"
            "try:\n    open('/proc/1/mem', 'rb').read(1)\n    res.append('MEM')\n"
            "except OSError as e:\n    res.append(('mem', e.errno))\nprint(res)")
    r = _py(sb, code)
    w = sb.run_python(code)
    bad = any("MEM" in x.stdout or ", 0, " in x.stdout for x in (r, w))
    return (r.ok and w.ok and not bad, f"cold {r.stdout.strip()} warm {w.stdout.strip()}")


def kill_parent(sb):
    a = sb.run("kill -9 $PPID; kill -9 1; kill -9 -1; true")
    b = sb.run_python("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
                      "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass")
    ok, after = _still_works(sb)
    w = sb.run_python("print('warm alive')")
    return (ok and w.stdout == "warm alive\n", f"{a.limit} {b.limit}; {after}")


def daemon(sb):
    r = sb.run("(setsid sh -c 'sleep 1; echo late > late.txt' &) ; echo started")
    w = sb.run_python("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                      "    if os.fork() == 0:\n        time.sleep(1)\n"
                      "        open('late2.txt', 'w').write('late')\n    os._exit(0)\nprint('ok')")
    time.sleep(1.5)
    files = sb.list_files()
    return (r.stdout == "started\n" and w.ok and "late.txt" not in files
            and "late2.txt" not in files, f"workspace after 1.5 s: {files}")


def privilege_escalation(sb):
    sb.write_file("f.txt", "x")
    code = ("import os, subprocess\nres = {}\n"
            "for name, fn in [('setuid', lambda: os.setuid(0)), ('setgid', lambda: os.setgid(0)),"
            " ('chown', lambda: os.chown('f.txt', 0, 0))]:\n"
            "    try:\n        fn()\n        res[name] = 'ALLOWED'\n"
            "    except OSError:\n        res[name] = 'denied'\n"
            "for name, argv in [('userns', ['unshare', '-Ur', 'true']), "
            "('mount', ['mount', '-t', 'tmpfs', 'x', '/tmp']), ('su', ['su', '-c', 'true'])]:\n"
            "    rc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL).returncode\n"
            "    res[name] = 'ALLOWED' if rc == 0 else 'denied'\n"
            "st = open('/proc/self/status').read().splitlines()\n"
            "res['status'] = [l for l in st if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))]\n"
            "print(res)")
    r = _py(sb, code)
    caps_zero = ("CapEff:\\t0000000000000000" in r.stdout
                 and "CapBnd:\\t0000000000000000" in r.stdout and "NoNewPrivs:\\t1" in r.stdout)
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
    return (refused == 10 and "root:" not in r.stdout, f"{refused}/10 file-API calls refused")


def hostname(sb):
    before = socket.gethostname()
    r = sb.run("hostname evil 2>&1; echo evil > /proc/sys/kernel/hostname 2>&1; hostname")
    return (socket.gethostname() == before and r.stdout.strip().endswith("sandbox"),
            r.stdout.strip().replace("\n", "; "))


def fd_and_proc_leaks(sb):
    r = _py(sb, "import os\nprint(sorted(os.listdir('/proc/self/fd')))\n"
                "print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    fds, nprocs = r.stdout.split("\n")[:2]
    return (fds in ("['0', '1', '2']", "['0', '1', '2', '3']") and int(nprocs) <= 4,
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
        if sb is not None:
            sb.close()
    if uid is not None:
        survivors = kill_uid(uid)
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
