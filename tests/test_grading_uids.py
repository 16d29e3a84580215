"""Two uids in a grading sandbox: the grader (uid 1000) and the policy programs it starts
(uid 1001, another host uid, no capabilities), so that a candidate's leftover daemon or planted
file cannot signal the grader, read its memory or write its files.

Each attack below is written against the grader; each must leave the verdict (or the grader's
own files and result) as it would be without it.
"""

from __future__ import annotations

import pytest

from posttrain.envs import play_actions
from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.tasks.families.terminal.harbor import load_harbor_task
from posttrain.verifiers import grading
from posttrain.verifiers.base import Outcome

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")

# A grading program that keeps a private file, then starts a candidate program (as the grader
# starts the agent's code) which leaves a daemon hammering every pid it can see with SIGKILL and
# trying to overwrite, replace and read the grader's files and memory. The grader outlives it.
ATTACKED = r'''
import subprocess, tempfile, time
d = tempfile.mkdtemp(prefix="grader-")
os.chmod(d, 0o755)  # even readable: the candidate must still not write it
result = os.path.join(d, "result.json")
with open(result, "w") as f:
    f.write("grader")
me = os.getpid()
daemon = f"""
import os, signal, time
os.setsid()
if os.fork():
    os._exit(0)
end = time.time() + 1.5
hits = set()
while time.time() < end:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
                hits.add(int(name))
            except OSError:
                pass
    for attempt in (lambda: open("{result}", "w").write("forged"),
                    lambda: open("{d}/planted", "w").write("x"),
                    lambda: os.rename("{d}", "/tmp/moved"),
                    lambda: open("/proc/{me}/environ").read(),
                    lambda: open("/proc/{me}/mem", "rb").read(1)):
        try:
            attempt()
            open("/tmp/breach", "a").write(str(attempt) + "\\n")
        except OSError:
            pass
    time.sleep(0.01)
"""
probe = ("id -u; grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status; "
         f"python3 -c '{daemon}' >/dev/null 2>&1 &")
p = subprocess.run(["sh", "-c", probe], capture_output=True, text=True, **as_candidate())
time.sleep(2.0)  # the daemon has had its go at us
breach = open("/tmp/breach").read() if os.path.exists("/tmp/breach") else ""
emit({"candidate": p.stdout, "result": open(result).read(), "entries": sorted(os.listdir(d)),
      "breach": breach, "uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read()})
'''


def test_a_candidates_daemon_cannot_kill_or_write_the_grader():
    with grading.grading_sandbox(None, ()) as sb:
        assert sb.info.layers.get("two uids") is True
        assert sb.candidate_host_uid not in (None, sb.host_uid)
        found = grading.run_grader(sb, ATTACKED, {}, timeout=30, label="uids")
    lines = found["candidate"].split("\n")
    assert lines[0] == "1001" and found["uid"] == 1000
    caps = dict(line.split(":\t") for line in lines[1:] if line)
    assert set(caps) == {"CapInh", "CapPrm", "CapEff", "CapAmb"}
    assert all(int(v, 16) == 0 for v in caps.values()), caps
    assert found["result"] == "grader" and found["entries"] == ["result.json"]
    assert found["breach"] == ""
    mapped = [line.split() for line in found["uid_map"].strip().splitlines()]
    assert [m[0] for m in mapped] == ["1000", "1001"] and mapped[0][1] != mapped[1][1]


def test_programs_the_grader_execs_keep_none_of_its_capabilities():
    prog = r'''
import subprocess
out = subprocess.run(["grep", "-E", "^Cap(Inh|Prm|Eff|Amb)", "/proc/self/status"],
                     capture_output=True, text=True).stdout
mine = open("/proc/self/status").read()
emit({"child": out, "self_eff": [l for l in mine.splitlines() if l.startswith("CapEff")][0]})
'''
    with grading.grading_sandbox(None, ()) as sb:
        found = grading.run_grader(sb, prog, {}, timeout=30, label="uids")
    assert int(found["self_eff"].split()[1], 16) != 0  # the grader itself holds them
    assert all(int(line.split()[1], 16) == 0 for line in found["child"].splitlines()), found


def test_candidate_code_without_an_episode_sandbox_gets_no_grader_capabilities():
    with grading.candidate_sandbox(Outcome(None, None)) as sb:
        assert "two uids" not in sb.info.layers
        r = sb.run_python("print(open('/proc/self/status').read())")
    eff = [line for line in r.stdout.splitlines() if line.startswith("CapEff")][0]
    assert int(eff.split()[1], 16) == 0


def _harbor_task(root):
    """A Docker-less Harbor task whose second test file is collected after the first one
    imported the agent's module."""
    (root / "tests").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "task.toml").write_text('[metadata]\nsplit = "train"\n[verifier]\ntimeout_sec = 60\n')
    (root / "instruction.md").write_text("Write /app/answer.py defining value() that returns 42.\n")
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\npython3 -m pytest -q -p no:cacheprovider /tests/test_a.py /tests/test_b.py\n"
        "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    (root / "tests" / "test_a.py").write_text(
        "import sys\nsys.path.insert(0, '/app')\nimport answer\n\n\ndef test_defined():\n"
        "    assert callable(answer.value)\n")
    (root / "tests" / "test_b.py").write_text(
        "import sys\nsys.path.insert(0, '/app')\nimport answer\n\n\ndef test_value():\n"
        "    assert answer.value() == 42\n")
    (root / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nprintf 'def value():\\n    return 42\\n' > /app/answer.py\n")
    return load_harbor_task(root)


REWRITE_TESTS = '''<bash>cat > answer.py <<'EOF'
import os
try:  # a test file pytest has not collected yet
    with open(os.path.join(os.environ.get("TEST_DIR", "/tests"), "test_b.py"), "w") as f:
        f.write("def test_value():\\n    pass\\n")
except OSError:
    pass


def value():
    return 0
EOF</bash>'''


def test_tested_code_cannot_rewrite_the_tests_it_is_tested_by(tmp_path):
    d = _harbor_task(tmp_path / "rewrite-tests")
    task = _task(d)
    assert play_actions(d, task, d.oracle(task)).passed
    v = play_actions(d, task, [REWRITE_TESTS, "<submit></submit>"])
    assert not v.passed, dict(v.details)
    assert "test_value" in str(v.details.get("output_tail", "")), dict(v.details)


def _task(d):
    for split in ("train", "eval"):
        try:
            return d.task(0, split)
        except ValueError:
            continue
    raise AssertionError(d.name)


# One grade of a reused grading sandbox: it plants state everywhere a later grade's program
# could look (its own namespace, a module the job server preloaded, /tmp, the workspace), and
# starts a candidate program that goes for the job server every grading program is forked from
# (it compiled and keeps this program's code: see `_forkserver._compiled`).
PLANTING = r'''
import json, subprocess
server = os.getppid()
seen = {"server": server, "planted_global": "planted" in globals(), "planted_module": hasattr(json, "planted"),
        "tmp": sorted(os.listdir("/tmp")), "ws": sorted(os.listdir("."))}
planted = True
json.planted = True
open("/tmp/left-by-grade", "w").write("x")
attack = f"""
import os, signal
for what, go in (("kill", lambda: os.kill({server}, signal.SIGKILL)),
                 ("mem", lambda: open("/proc/{server}/mem", "rb").read(1)),
                 ("environ", lambda: open("/proc/{server}/environ").read()),
                 ("stop", lambda: os.kill({server}, signal.SIGSTOP))):
    try:
        go()
        print("reached", what)
    except OSError as e:
        print("refused", what, type(e).__name__)
"""
p = subprocess.run(["python3", "-c", attack], capture_output=True, text=True, **as_candidate())
seen["candidate"] = p.stdout
emit(seen)
'''


def test_consecutive_grades_share_a_job_server_the_candidate_cannot_reach_and_see_nothing_of_each_other():
    from posttrain.sandbox import open_sandbox

    with open_sandbox(preload=grading.GRADING_PRELOAD, two_uids=True) as sb:
        first = grading.run_grader(sb, PLANTING, {}, timeout=30, label="reuse")
        assert sb.reset().reusable  # what a grading pool does between two grades
        second = grading.run_grader(sb, PLANTING, {}, timeout=30, label="reuse")
    assert first["candidate"].split("\n")[:4] == [f"refused {w} PermissionError"
                                                   for w in ("kill", "mem", "environ", "stop")]
    assert second["server"] == first["server"]  # the same job server, unharmed, served both
    for seen in (first, second):
        assert not seen["planted_global"] and not seen["planted_module"]
        assert seen["tmp"] == [] and seen["ws"] == []
