"""Task folders in the Harbor / Terminal-Bench layout, run in our sandbox without Docker.

    my-task/
      instruction.md          what the agent is told (required, non-empty)
      task.toml               [metadata] (optional table), [agent].timeout_sec,
                              [verifier].timeout_sec, [environment].memory_mb (all optional)
      environment/Dockerfile  built into an image without Docker (`posttrain.images`): FROM a
                              Debian/Ubuntu/Python base derived from the host, RUN (as root in
                              a user namespace; no network unless the source asks for it at
                              build time: harbor:DIR?network=1, then per step RUN
                              --network=default|none), COPY/ADD (ADD of a URL: only with
                              ?network=1, `--checksum` honoured), WORKDIR, ENV, USER,
                              ENTRYPOINT/CMD (a service started before the first turn); what
                              cannot be honoured is an error naming the line. The episode runs
                              over a writable copy of the image, in its WORKDIR, as its USER
      tests/test.sh           the verifier entry point (required) + any test_*.py / data files
      solution/solve.sh       the reference solution (required: it is the domain's oracle)
                              (tests/ and solution/ arrive exactly: binary files byte for byte,
                              modes, empty directories, symlinks that stay inside the folder;
                              UTF-8 files get the path rewriting below, binary ones do not)
      solution/wrong.sh       optional (our extension): a plausible wrong solution (a negative)

`load_harbor_task(dir)` returns a `Domain` named `terminal.harbor.<folder name>`. A malformed
folder raises `HarborTaskError` naming the file and field.

How it maps onto the sandbox: with a Dockerfile the episode's sandbox is the task's image and
its WORKDIR (usually `/app`) the workspace; the first observation is the instruction and at
most 20 non-hidden names the Dockerfile puts in the WORKDIR. Without one, `/app` is the plain
sandbox's workspace (the instruction says so, and `/app/...` paths in it are shown relative).
After the episode, grading (`harbor_grading.py`) happens in a *fresh* sandbox (over the task's image, if it has one)
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
program (it reads tests/ as "other"; an entry other could not read or enter, a 0600 file or
a 0700 directory, gets its group with read/exec group bits, so it reads what Harbor's root could). Not covered: code under test runs inside the test process as the test's own uid, so
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
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.families.common import content_split
from posttrain.tasks.families.terminal.harbor_grading import HARBOR, REWRITE, WRITE_TREE
from posttrain.values.task import FileEntry, Split, Task, TaskLimits, check_workspace_path

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
MAX_FILE_BYTES = 1 << 20


class HarborTaskError(ValueError):
    """A task folder that does not follow the layout; the message names the file and field."""


def _oracle_program(files: dict[str, str | dict], script: str) -> str:
    """`<python>` code that writes solution/ to a temp dir (paths rewritten) and runs `script`."""
    return REWRITE + WRITE_TREE + f'''
import json, subprocess, tempfile
ws = os.getcwd()
root = tempfile.mkdtemp(prefix="ptsolution-")
write_tree(root, json.loads({json.dumps(json.dumps(files))}), lambda text: rewrite(text, ws, solution=root))
r = subprocess.run(["bash", os.path.join(root, {script!r})], cwd=ws, stdin=subprocess.DEVNULL)
print("{script} exited with", r.returncode)
'''


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


def _tree(base: Path, root: Path) -> dict[str, str | dict]:
    """Every entry under `base` (tests/ or solution/): a UTF-8 file of mode 0644 as its text
    (what a folder of text files always was: its task hash is unchanged), every other entry
    exactly as a `FileEntry` (JSON): binary bytes, other modes (an executable helper, setuid
    bits), empty directories, and symlinks that stay inside `base`."""
    out: dict[str, str | dict] = {}
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base).as_posix()
        where = f"{root.name}/{path.relative_to(root).as_posix()}"
        st = path.lstat()
        mode = stat.S_IMODE(st.st_mode)
        try:
            if stat.S_ISLNK(st.st_mode):
                entry = FileEntry.symlink(os.readlink(path))
                check_workspace_path(rel, entry)
            elif stat.S_ISDIR(st.st_mode):
                if mode == 0o755 and any(path.iterdir()):
                    continue  # implied by what it holds
                entry = FileEntry.directory(mode)
            elif stat.S_ISREG(st.st_mode):
                if st.st_size > MAX_FILE_BYTES:
                    raise HarborTaskError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
                data = path.read_bytes()
                try:
                    if mode == 0o644:
                        out[rel] = data.decode("utf-8")
                        continue
                except UnicodeDecodeError:
                    pass
                entry = FileEntry.file(data, mode)
            else:
                raise HarborTaskError(f"{where}: not a file, directory or symbolic link")
        except ValueError as e:
            if isinstance(e, HarborTaskError):
                raise
            raise HarborTaskError(f"{where}: {e}") from None
        out[rel] = entry.model_dump(mode="json")
    return out


def _number(table: dict, section: str, key: str, default: float, where: str) -> float:
    value = table.get(section, {}).get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise HarborTaskError(f"{where}: field [{section}].{key} must be a positive, finite number, got {value!r}")
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
    from posttrain.images.dockerfile import DockerfileError, network_refusal, plan
    from posttrain.images.episode import recipe_digest, register

    dockerfile = root / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return None, "/app", ""
    where = f"{root.name}/environment/Dockerfile"
    try:
        p = plan(dockerfile)
        refused = network_refusal(p, str(dockerfile), build_network)
        if refused is not None:
            raise refused
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


def _is_utf8(entry: dict) -> bool:
    try:
        FileEntry.model_validate(entry).data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
        if isinstance(content, str) and "</python>" in content:
            raise HarborTaskError(f"{root.name}/solution/{rel}: contains '</python>', which the oracle cannot carry")
    conftest = tests.get("conftest.py")
    if isinstance(conftest, dict) and (conftest["kind"] != "file" or not _is_utf8(conftest)):
        raise HarborTaskError(f"{root.name}/tests/conftest.py: must be a UTF-8 text file (the grader "
                              "prepends its pytest guard to it)")
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
