"""The grader of Harbor task folders (`harbor.py` loads them): the programs run inside the
grading sandbox (path rewriting, the pytest guard plugin, the grading program that runs
`tests/test.sh`) and `HarborVerifier`, which runs them and reads the reward. What it promises,
and what it does not, is in `harbor.py`'s module docstring.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from posttrain.values.task import Task
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.grading import GRADER_MARGIN_S, grading_context, run_grader

# In-sandbox path rewriting, shared by the grader and the oracle (source text, run there).
REWRITE = r'''
import re as _re


def rewrite(text, app, tests=None, logs=None, solution=None):
    """Map Harbor's absolute paths onto this sandbox's directories (textually)."""
    for src, dst in (("/logs/verifier", logs), ("/tests", tests), ("/solution", solution), ("/app", app)):
        if dst:
            text = _re.sub(r"(?<![\w.~/-])" + src + r"(?![\w.-])", lambda m: dst, text)
    return text
'''

# In-sandbox writing of a task folder's tests/ or solution/ (source text, run there): a text
# entry is written rewritten with the mode Harbor's images usually give it (0755 for a .sh,
# else 0644); a `FileEntry` (JSON) with its exact mode: a UTF-8 file rewritten like text, any
# other byte-exact; a symlink as it is; a directory's mode set after its contents are written.
WRITE_TREE = r"""
import base64 as _b64, os


def write_tree(root, files, rewrite_text):
    dirs = []
    for rel, e in sorted(files.items(), key=lambda kv: kv[0].split("/")):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(e, str):
            with open(path, "w") as f:
                f.write(rewrite_text(e))
            os.chmod(path, 0o755 if rel.endswith(".sh") else 0o644)
        elif e["kind"] == "dir":
            os.makedirs(path, exist_ok=True)
            dirs.append((path, e["mode"]))
        elif e["kind"] == "symlink":
            os.symlink(e["target"], path)
        else:
            data = _b64.b64decode(e["b64"])
            try:
                data = rewrite_text(data.decode("utf-8")).encode("utf-8")
            except UnicodeDecodeError:
                pass
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, e["mode"])
    for path, mode in reversed(dirs):
        os.chmod(path, mode)
"""

# A pytest plugin (prepended to the tests' conftest.py, which only the grader writes): it records
# that each pytest session started and how it finished. A session that started and never
# finished means the tested code ended the test process (`os._exit(0)` on import): whatever
# reward test.sh then writes does not count.
GUARD = r'''
import json as _ptg_json, os as _ptg_os
_PTG_FILE = _ptg_os.environ.get("PTGUARD_FILE")
_ptg_counts = {"passed": 0, "failed": 0}


def _ptg_write(obj):
    if _PTG_FILE:
        with open(_PTG_FILE, "a") as f:
            f.write(_ptg_json.dumps(obj) + "\n")


def pytest_sessionstart(session):
    _ptg_write({"start": _ptg_os.getpid()})


def pytest_runtest_logreport(report):
    if report.failed:
        _ptg_counts["failed"] += 1
    elif report.passed and report.when == "call":
        _ptg_counts["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    _ptg_write({"finish": _ptg_os.getpid(), "status": int(exitstatus), **_ptg_counts})
'''

GRADER = REWRITE + WRITE_TREE + r'''
import signal, subprocess, tempfile, time


def readable_to_tests(top):
    """Let test.sh (the candidate uid, which reads tests/ as "other") read and run what Harbor's
    root could: a file other cannot read (0600) or a directory other cannot enter (0700) gets
    the test uid's group, with the owner's read/exec bits as its group bits and never write
    (0600 shows as 0640 then: the one visible change). Everything else keeps its exact mode;
    setuid/setgid entries are left as they are (a chown would clear those bits)."""
    if _CANDIDATE_UID < 0:
        return
    for d, dirs, names in os.walk(top):
        for n in dirs + names:
            path = os.path.join(d, n)
            st = os.lstat(path)
            kind, mode = st.st_mode & 0o170000, st.st_mode & 0o7777
            need = 0o004 if kind == 0o100000 else 0o001 if kind == 0o040000 else 0
            if not need or mode & (need | 0o6000) or not mode & (need << 6):
                continue
            os.lchown(path, -1, _CANDIDATE_UID)
            os.chmod(path, (mode & ~0o070) | ((mode >> 3) & 0o050))

p = _PAYLOAD
ws = os.getcwd()
# A fresh grading sandbox: its /tmp held nothing of the episode's, and only this program and
# what it starts write there.
root = tempfile.mkdtemp(prefix="ptharbor-")
os.chmod(root, 0o755)  # test.sh runs as the candidate uid (two-uid sandbox): it reads tests/
tests, logs = os.path.join(root, "tests"), os.path.join(root, "logs", "verifier")
shim, home = os.path.join(root, "bin"), os.path.join(root, "home")
for d in (logs, shim, home):
    os.makedirs(d)
files = dict(p["tests"])
conftest = files.get("conftest.py", "")
if isinstance(conftest, dict):  # a UTF-8 file with another mode (the loader checked)
    conftest = _b64.b64decode(conftest["b64"]).decode("utf-8")
files["conftest.py"] = p["guard"] + "\n" + conftest
write_tree(tests, files, lambda text: rewrite(text, ws, tests, logs))
readable_to_tests(tests)
ini = os.path.join(root, "pytest.ini")
with open(ini, "w") as f:
    f.write("[pytest]\n")
for name in ("python", "python3"):  # every Python the tests start runs isolated (-I)
    with open(os.path.join(shim, name), "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -I \"$@\"\n")
    os.chmod(os.path.join(shim, name), 0o755)
guard = os.path.join(home, "guard.jsonl")
out = tempfile.TemporaryFile(dir=root)
env = {"PATH": f"{shim}:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
       "HOME": home, "LANG": "C.UTF-8", "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1",
       "TEST_DIR": tests, "PTGUARD_FILE": guard, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
       "PYTEST_ADDOPTS": f"-c {ini} --rootdir={tests} --confcutdir={tests} -p no:cacheprovider"}
policy_input()  # test.sh runs the agent's code and reads its files
# The tests and the code they test write only the workspace, their $HOME and the reward
# directory; tests/, the shims, the ini and this program stay the grader's (uid 1000)
give_to_candidate(ws, logs, home)
t0 = time.monotonic()
proc = subprocess.Popen(["bash", os.path.join(tests, "test.sh")], cwd=tests, env=env,
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True, **as_candidate())
status = "exited"
try:
    proc.wait(timeout=p["timeout_s"])
except subprocess.TimeoutExpired:
    status = "timeout"


def _ancestors():
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                pid = int(next(l for l in f if l.startswith("PPid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            break
    return out | {1}


# Everything else in this sandbox is the tests' or the agent's: kill it (a daemon that escaped
# the process group must not write the reward after test.sh wrote it), then read the reward.
keep = _ancestors()
for _ in range(3):
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
proc.wait()


def _read(path, n=4096):
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    with open(path, "rb") as f:
        return f.read(n).decode("utf-8", "replace")


out.seek(0, 2)
size = out.tell()
out.seek(max(0, size - 2000))
emit({"status": status, "returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 3),
      "reward_txt": _read(os.path.join(logs, "reward.txt")),
      "reward_json": _read(os.path.join(logs, "reward.json")),
      "guard": (_read(guard, 65536) or "").splitlines()[:200],
      "output_tail": out.read().decode("utf-8", "replace")})
'''


@dataclass(frozen=True)
class HarborVerifier:
    """Runs a Harbor task's `tests/test.sh` after the episode (see the module docstring).

    `task.verifier`: `tests` (relative path under tests/ -> its text when it is a UTF-8 file of
    mode 0644, else its `FileEntry` as JSON: bytes and mode, a directory, a symlink), `timeout_s`,
    `artifacts` (workspace globs the agent is meant to change; every other task input file is
    restored from the task before grading)."""

    name: str = "harbor"
    version: str = "4"  # 3: tests/ carries binary files, modes, directories and symlinks;
    # 4: test.sh can read a tests/ entry other could not (0600 files, 0700 directories)
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        tests, timeout = task.verifier.get("tests"), float(task.verifier.get("timeout_s", 0) or 0)
        if not isinstance(tests, dict) or "test.sh" not in tests or timeout <= 0:
            raise VerifierError(f"task {task.key}: harbor verifier needs 'tests' with test.sh and a timeout_s")
        label = f"harbor verifier, task {task.key}"
        try:
            image, limits = self._image(task)
            with grading_context(outcome, pristine=task.workspace(), writable=task.verifier.get("artifacts") or (),
                                 image=image, limits=limits, label=label) as sandbox:
                found = run_grader(sandbox, GRADER, {"tests": tests, "timeout_s": timeout, "guard": GUARD},
                                   timeout=timeout + GRADER_MARGIN_S, label=label)
        except GradingFailed as e:
            return failed_grading(self, e)
        tail = str(found.get("output_tail", ""))[-800:]
        common = {"test_exit": found.get("returncode"), "seconds": found.get("seconds"), "output_tail": tail}
        if found.get("status") == "timeout":
            return verdict(self, False, reason=f"tests/test.sh ran past the verifier timeout ({timeout:g} s)",
                           **common)
        broken = self._unfinished_pytest(found.get("guard"))
        reward = self._reward(found)
        if isinstance(reward, str):
            return verdict(self, False, reason=reward, **common)
        if broken and reward > 0:
            return verdict(self, False, reason=broken, reward=reward, **common)
        return verdict(self, reward >= 1.0, min(1.0, max(0.0, reward)), reward=reward, **common)

    @staticmethod
    def _image(task: Task) -> tuple[dict | None, Any]:
        """The task's image (its tests run over a fresh copy of it) and its limits, or Nones."""
        if not task.verifier.get("image"):
            return None, None
        from posttrain.images.episode import ImageUnavailable, image_for, limits_for

        try:
            image = image_for(task)
        except ImageUnavailable as e:
            raise VerifierError(f"task {task.key}: cannot grade over its image: {e}") from e
        return (image.sandbox_config() if image is not None else None), limits_for(task)

    @staticmethod
    def _unfinished_pytest(lines: Any) -> str | None:
        """Why the guard's record shows a pytest session that did not end normally, or None."""
        started, finished = [], {}
        for line in lines if isinstance(lines, list) else []:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError, TypeError):
                continue
            if isinstance(obj, dict) and "start" in obj:
                started.append(obj["start"])
            elif isinstance(obj, dict) and "finish" in obj:
                finished[obj["finish"]] = obj
        for pid in started:
            end = finished.get(pid)
            if end is None:
                return "a pytest run never finished (the tested code ended the test process)"
            if end.get("status") == 0 and not end.get("passed"):
                return "a pytest run passed without running any test"
        return None

    @staticmethod
    def _reward(found: dict[str, Any]) -> float | str:
        """The reward test.sh wrote, or why there is none (a failed verdict: the agent's code
        runs inside the tests and can stop them before they write it)."""
        text, blob = found.get("reward_txt"), found.get("reward_json")
        try:
            if text is not None and text.strip():
                value = float(text.strip().split()[0])
            elif blob is not None:
                data = json.loads(blob)
                value = float(data["reward"] if isinstance(data, dict) and "reward" in data else data)
            else:
                return (f"tests/test.sh wrote no reward (neither /logs/verifier/reward.txt nor "
                        f"reward.json); exit status {found.get('returncode')}")
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            return f"unreadable reward ({text or blob!r:.80}): {type(e).__name__}"
        if not math.isfinite(value):
            return f"the reward is not a finite number ({value})"
        return value


HARBOR = HarborVerifier()
