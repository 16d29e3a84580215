"""Task folders in the Harbor / Terminal-Bench layout, run in our sandbox without Docker.

    my-task/
      instruction.md          what the agent is told (required, non-empty)
      task.toml               [metadata] (optional table), [agent].timeout_sec,
                              [verifier].timeout_sec, [environment].memory_mb (all optional)
      environment/Dockerfile  built into an image without Docker (`posttrain.images`): FROM a
                              Debian/Ubuntu/Python base derived from the host, RUN (as root in
                              a user namespace; no network unless the source asks for it at
                              build time: harbor:DIR?network=1), COPY/ADD, WORKDIR, ENV, USER,
                              ENTRYPOINT/CMD (a service started before the first turn); what
                              cannot be honoured is an error naming the line. The episode runs
                              over a writable copy of the image, in its WORKDIR, as its USER
      tests/test.sh           the verifier entry point (required) + any test_*.py / data files
      solution/solve.sh       the reference solution (required: it is the domain's oracle)
      solution/wrong.sh       optional (our extension): a plausible wrong solution (a negative)

`load_harbor_task(dir)` returns a `Domain` named `terminal.harbor.<folder name>`. A malformed
folder raises `HarborTaskError` naming the file and field.

How it maps onto the sandbox: with a Dockerfile the episode's sandbox is the task's image and
its WORKDIR (usually `/app`) the workspace; the first observation is the instruction and at
most 20 non-hidden names the Dockerfile puts in the WORKDIR. Without one, `/app` is the plain
sandbox's workspace (the instruction says so, and `/app/...` paths in it are shown relative).
After the episode, grading happens in a *fresh* sandbox (over the task's image, if it has one)
(`verifiers/grading.py`): a copy of the episode's workspace, with every task input file restored
from the task except those `[verifier].artifacts` (our extension: workspace globs) names as the
agent's to change, so tests that recompute their expectation from input data see the original
data. The grading program creates a directory under that sandbox's fresh `/tmp`, writes `tests/`
(plus a conftest guard), an empty `logs/verifier/`, its own `pytest.ini`, and `python`/`python3`
shims that add `-I`; rewrites the absolute paths `/tests`, `/logs/verifier` and `/app` in the
test files (a textual rewrite: a path built at run time is not caught), and runs
`bash tests/test.sh` from the tests directory with a fixed `PATH`, `PYTEST_ADDOPTS` = `-c
<its ini> --rootdir=<tests> --confcutdir=<tests> -p no:cacheprovider` and
`PYTEST_DISABLE_PLUGIN_AUTOLOAD=1` (no configuration, conftest or plugin from anywhere the agent
wrote). When test.sh ends, every other process in the sandbox is killed, then the reward is read
from `logs/verifier/reward.txt` (a number), else `reward.json` (`{"reward": x}`).

A pytest session that started and never finished (tested code that calls `os._exit(0)` on
import, or kills the tests after writing a reward) or that "passed" without running a test
voids a positive reward. Without an image, `test.sh` and everything it starts run as the
grading sandbox's candidate uid (`verifiers/grading.py`, "Two uids"): the tested code cannot
rewrite tests/ (a test file not collected yet), the shims or the ini, nor signal the grading
program. Not covered: code under test runs inside the test process as the test's own uid, so
code written against this grader (writing the reward, forging the guard's record) is not
stopped; with an image, tests and tested code share the grading program's uid; see the
README's threat model.

Scoring follows Harbor: reward >= 1 passes, the score is the reward clipped to [0, 1]. Unlike
Harbor, a test script that writes no reward or runs past `[verifier].timeout_sec` is a failed
verdict, not an infrastructure error: the agent's code runs inside the tests and can cause both.

Splits: a task folder is one fixed problem, in one split: `[metadata].split` ("train" or
"eval") when given, else a hash of its content (as for generated domains). Asking the domain
for the other split raises `NoTasksInSplit` (a `ValueError`); every seed gives the same task.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.families.common import content_split
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.grading import GRADER_MARGIN_S, grading_context, run_grader

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
MAX_FILE_BYTES = 1 << 20


class HarborTaskError(ValueError):
    """A task folder that does not follow the layout; the message names the file and field."""


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

GRADER = REWRITE + r'''
import signal, subprocess, tempfile, time

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
files["conftest.py"] = p["guard"] + "\n" + files.get("conftest.py", "")
for rel, content in files.items():
    path = os.path.join(tests, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(rewrite(content, ws, tests, logs))
    os.chmod(path, 0o755 if rel.endswith(".sh") else 0o644)
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


def _oracle_program(files: dict[str, str], script: str) -> str:
    """`<python>` code that writes solution/ to a temp dir (paths rewritten) and runs `script`."""
    return REWRITE + f'''
import os, subprocess, tempfile
ws = os.getcwd()
root = tempfile.mkdtemp(prefix="ptsolution-")
files = {json.dumps(files)}
for rel, content in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(rewrite(content, ws, solution=root))
r = subprocess.run(["bash", os.path.join(root, {script!r})], cwd=ws, stdin=subprocess.DEVNULL)
print("{script} exited with", r.returncode)
'''


@dataclass(frozen=True)
class HarborVerifier:
    """Runs a Harbor task's `tests/test.sh` after the episode (see the module docstring).

    `task.verifier`: `tests` (relative path -> text of every file under tests/), `timeout_s`,
    `artifacts` (workspace globs the agent is meant to change; every other task input file is
    restored from the task before grading)."""

    name: str = "harbor"
    version: str = "2"
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


# --- loading a folder ---------------------------------------------------------------------

def _read_text(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    if path.is_symlink():
        raise HarborTaskError(f"{root.name}/{rel}: symbolic links are not supported")
    data = path.read_bytes()
    if len(data) > MAX_FILE_BYTES:
        raise HarborTaskError(f"{root.name}/{rel}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HarborTaskError(f"{root.name}/{rel}: not UTF-8 text (binary files are not supported)") from None


def _tree(base: Path, root: Path) -> dict[str, str]:
    return {p.relative_to(base).as_posix(): _read_text(p, root)
            for p in sorted(base.rglob("*")) if p.is_file() or p.is_symlink()}


def _number(table: dict, section: str, key: str, default: float, where: str) -> float:
    value = table.get(section, {}).get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HarborTaskError(f"{where}: field [{section}].{key} must be a positive number, got {value!r}")
    return float(value)


def _config(root: Path) -> dict[str, Any]:
    where = f"{root.name}/task.toml"
    path = root / "task.toml"
    if not path.is_file():
        raise HarborTaskError(f"{where}: missing")
    try:
        config = tomllib.loads(_read_text(path, root))
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"{where}: invalid TOML: {e}") from None
    for section in ("metadata", "agent", "verifier", "environment"):
        if section in config and not isinstance(config[section], dict):
            raise HarborTaskError(f"{where}: [{section}] must be a table, got {config[section]!r}")
    split = config.get("metadata", {}).get("split")
    if split is not None and split not in ("train", "eval"):
        raise HarborTaskError(f"{where}: field [metadata].split must be 'train' or 'eval', got {split!r}")
    artifacts = config.get("verifier", {}).get("artifacts", [])
    if not (isinstance(artifacts, list) and all(isinstance(a, str) and a and not a.startswith("/")
                                                 and ".." not in a.split("/") for a in artifacts)):
        raise HarborTaskError(f"{where}: field [verifier].artifacts must be a list of workspace-relative "
                              f"paths or globs, got {artifacts!r}")
    return {"artifacts": [_app_relative(a).removeprefix("./") for a in artifacts],
            "agent_timeout": _number(config, "agent", "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, where),
            "verifier_timeout": _number(config, "verifier", "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, where),
            "memory_mb": int(_number(config, "environment", "memory_mb", 1024, where)),
            "metadata": config.get("metadata", {}), "split": split}


def _environment(root: Path, build_network: bool = False) -> tuple[dict | None, str, str]:
    """(the task's image spec, its working directory, a short view of the workspace) from
    environment/Dockerfile: every instruction is honoured or refused here with its line (see
    `posttrain.images.dockerfile`); the image itself is built on first use. No Dockerfile:
    (None, "/app", "") and the episode runs in a plain sandbox."""
    from posttrain.images.base import BaseImageError, resolve_base
    from posttrain.images.build import BuildError, copy_entries
    from posttrain.images.dockerfile import DockerfileError, plan
    from posttrain.images.episode import recipe_digest, register

    dockerfile = root / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return None, "/app", ""
    where = f"{root.name}/environment/Dockerfile"
    try:
        p = plan(dockerfile)
        try:
            resolve_base(p.base)
        except BaseImageError as e:
            raise DockerfileError(f"{dockerfile}:{p.base_line}: {e}") from None
        digest = recipe_digest(p, dockerfile.parent, str(dockerfile))
        shown = []
        for step in p.steps:
            if step["kind"] == "copy":
                shown += [e["path"] + ("/" if e["type"] == "dir" else "")
                          for e in copy_entries(step, dockerfile.parent, "")]
    except (DockerfileError, BuildError, UnicodeDecodeError) as e:
        raise HarborTaskError(str(e).replace(str(dockerfile), where)) from None
    register(digest, dockerfile, network=build_network)
    return {"recipe": digest, "dockerfile": where}, p.workdir, _view(shown, p.workdir)


MAX_SHOWN = 20


def _view(paths: list[str], workdir: str) -> str:
    """The top of the workspace as the Dockerfile fills it: at most MAX_SHOWN names, no hidden
    ones (the policy can `ls -a`); what RUN steps create is not predicted here."""
    prefix = workdir.rstrip("/") + "/"
    names = sorted({p[len(prefix):].split("/")[0] + ("/" if "/" in p[len(prefix):] else "")
                    for p in paths if p.startswith(prefix) and p != prefix})
    names = [n for n in names if not n.startswith(".")]
    if not names:
        return ""
    more = f" (and {len(names) - MAX_SHOWN} more)" if len(names) > MAX_SHOWN else ""
    return f"\n\nIn {workdir}: " + ", ".join(names[:MAX_SHOWN]) + more


def _app_relative(text: str) -> str:
    return re.sub(r"(?<![\w.~/-])/app(?![\w.-])/?", lambda m: "./" if m.group().endswith("/") else ".", text)


def load_harbor_task(path: str | Path, name: str | None = None, *,
                     build_network: bool = False) -> Domain:
    """A domain for one task folder (see the module docstring). `build_network`: its image's
    RUN steps may use the host's network while building (never its episodes)."""
    root = Path(path)
    if not root.is_dir():
        raise HarborTaskError(f"{root}: not a directory")
    cfg = _config(root)
    if not (root / "instruction.md").is_file():
        raise HarborTaskError(f"{root.name}/instruction.md: missing")
    instruction = _read_text(root / "instruction.md", root).strip()
    if not instruction:
        raise HarborTaskError(f"{root.name}/instruction.md: empty")
    tests = _tree(root / "tests", root) if (root / "tests").is_dir() else {}
    if "test.sh" not in tests:
        raise HarborTaskError(f"{root.name}/tests/test.sh: missing (the verifier entry point)")
    solution = _tree(root / "solution", root) if (root / "solution").is_dir() else {}
    if "solve.sh" not in solution:
        raise HarborTaskError(f"{root.name}/solution/solve.sh: missing (the domain's oracle)")
    for rel, content in solution.items():
        if "</python>" in content:
            raise HarborTaskError(f"{root.name}/solution/{rel}: contains '</python>', which the oracle cannot carry")
    image, workdir, view = _environment(root, build_network)
    files: dict[str, str] = {}
    slug = re.sub(r"[^a-z0-9-]+", "-", (name or root.name).lower()).strip("-")
    if not slug:
        raise HarborTaskError(f"{root}: cannot make a domain name from the folder name")
    domain_name = f"terminal.harbor.{slug}"
    if image is None:
        prompt = ("(You are in the task's working directory, which the instructions call /app; "
                  "paths below are relative to it.)\n\n" + _app_relative(instruction))
    else:  # the task's own image: its paths are real
        prompt = f"(You are in {workdir}, the task's working directory.)\n\n{instruction}{view}"
    split: Split = cfg["split"] or content_split(prompt, files)
    limits = TaskLimits(max_turns=50, max_tokens=1024, context_tokens=16384, time_s=cfg["agent_timeout"],
                        command_timeout_s=min(cfg["agent_timeout"], 120.0), memory_mb=max(16, cfg["memory_mb"]))
    wrong = solution.pop("wrong.sh", None)
    tags = ("terminal", "harbor") + tuple(str(t) for t in cfg["metadata"].get("tags", ()) if isinstance(t, str))

    def generate(seed: int, want: Split) -> Task:
        if want != split:
            raise NoTasksInSplit(f"domain {domain_name} is one imported task of the {split} split; "
                             f"it has no {want} tasks")
        return Task(domain=domain_name, prompt=prompt, files=files, env="tools", split=split, seed=0,
                    key=f"{domain_name}/{split}/0", limits=limits, tags=tags,
                    reference={"solution": solution, "wrong": wrong, "folder": root.name},
                    verifier={"tests": tests, "timeout_s": cfg["verifier_timeout"],
                              "artifacts": cfg["artifacts"],
                              **({"image": image} if image else {})})

    def oracle(task: Task) -> list[str]:
        return [f"<python>{_oracle_program(task.reference['solution'], 'solve.sh')}</python>", "<submit></submit>"]

    def negatives(task: Task) -> dict[str, list[str]]:
        out = {"empty": ["<submit></submit>"], "look-only": ["<bash>ls -la; cat *.md 2>/dev/null | head</bash>",
                                                            "<submit>done</submit>"]}
        if task.reference.get("wrong"):
            files = {**task.reference["solution"], "wrong.sh": task.reference["wrong"]}
            out["wrong"] = [f"<python>{_oracle_program(files, 'wrong.sh')}</python>", "<submit></submit>"]
        return out

    return Domain(name=domain_name, family="terminal", env="tools", verifier=HARBOR, generate=generate,
                  oracle=oracle, negatives=negatives, tags=tags,
                  description=f"Harbor task {root.name}: {instruction.splitlines()[0][:80]}")
