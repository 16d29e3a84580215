"""Permission, process and archive domains (`terminal.perm.*`, `terminal.proc.*`,
`terminal.archive.*`).

Processes the policy leaves running are killed before grading, so process tasks leave their
evidence in files (exit statuses, captured output), which the check reads.
"""

from __future__ import annotations

import random

from posttrain.tasks.families.terminal.checks import TAR_CHECK
from posttrain.tasks.families.terminal.common import ShellProblem, ident, submit, text, word
from posttrain.values.task import Split


def executable(rng: random.Random) -> ShellProblem:
    names = sorted({word(rng) for _ in range(rng.randint(3, 6))})
    files = {}
    for i, n in enumerate(names):
        ext = "sh" if i == 0 else "txt" if i == 1 else rng.choice(["sh", "txt"])
        files[f"bin/{n}.{ext}"] = f"#!/bin/sh\necho {n}\n" if ext == "sh" else f"{n}\n"
    modes = {p: (0o755 if p.endswith(".sh") else 0o644) for p in files}
    return ShellProblem(
        prompt="Make every .sh file in bin/ executable with mode 755 (rwxr-xr-x); the other files "
               "keep mode 644.",
        files=files, args={"modes": modes},
        oracle=["<bash>chmod 755 bin/*.sh && ls -l bin</bash>", submit("")],
        wrong={"all": ["<bash>chmod 755 bin/*</bash>", submit("")],
               "user-only": ["<bash>chmod 744 bin/*.sh</bash>", submit("")]})


def private(rng: random.Random) -> ShellProblem:
    names = sorted({f"{word(rng)}.key" for _ in range(rng.randint(2, 4))})
    files = {f"secrets/{n}": f"{ident(rng, 16)}\n" for n in names}
    files["README"] = "public\n"
    modes = {f"secrets/{n}": 0o600 for n in names} | {"secrets": 0o700, "README": 0o644}
    return ShellProblem(
        prompt="Lock down secrets/: the directory gets mode 700 and every file in it mode 600. "
               "README stays as it is.",
        files=files, args={"modes": modes},
        oracle=["<bash>chmod 600 secrets/* && chmod 700 secrets && ls -la secrets</bash>", submit("")],
        wrong={"files-only": ["<bash>chmod 600 secrets/*</bash>", submit("")],
               "group-read": ["<bash>chmod 640 secrets/* && chmod 750 secrets</bash>", submit("")]})


def exit_codes(rng: random.Random) -> ShellProblem:
    names = sorted({word(rng) for _ in range(rng.randint(3, 6))})
    codes = {n: rng.choice([0, 0, 1, 2, 3, 7, 42]) for n in names}
    if all(c == 0 for c in codes.values()):
        codes[names[0]] = 3
    files = {f"jobs/{n}.sh": f"echo running {n}\nexit {c}\n" for n, c in codes.items()}
    want = [f"{n} {codes[n]}" for n in names]
    return ShellProblem(
        prompt="Run each script in jobs/ with sh and write results.txt with one line 'NAME STATUS' "
               "per script (NAME without directory and .sh, STATUS its exit status), sorted by name.",
        files=files, args={"files": {"results.txt": text(want)}},
        oracle=["<bash>for f in jobs/*.sh; do n=$(basename $f .sh); sh $f > /dev/null; echo \"$n $?\"; "
                "done > results.txt; cat results.txt</bash>", submit("")],
        wrong={"all-zero": [f'<write path="results.txt">{text([f"{n} 0" for n in names])}</write>', submit("")]})


TIMEOUT_SPLITS: dict[str, Split] = {"endless": "train", "kill": "train", "preserve": "eval"}
FINISH_CODES: dict[Split, tuple[int, ...]] = {"train": (0, 1, 3, 5, 42), "eval": (2, 7, 9)}


def timeout_status(rng: random.Random) -> ShellProblem:
    """What `timeout` returns depends on the program and on the signal: 124 when the limit ends
    it, the program's own status when it finishes first, 128+9 with `-s KILL`, 128+15 with
    `--preserve-status`. The prompt does not say which case this is: the script (or running it)
    does.

    The answer is one of a handful of statuses, so the split goes by it: eval problems are the
    `--preserve-status` case (143) and programs that exit 2, 7 or 9, training ones the rest --
    by content, an eval problem's expected status.txt, script and oracle were each a training
    problem's. Scripts and their names carry a random tag, so no two problems share a file."""
    tag = ident(rng)
    name = f"{word(rng)}-{tag}.sh"
    secs = rng.choice([2, 3])
    case = rng.choice(["endless", "finishes", "finishes", "kill", "preserve"])
    if case == "finishes":  # done in about 0.2-0.4 s, far inside the limit
        split: Split = "eval" if rng.random() < 0.5 else "train"
        ticks, code = rng.randint(1, 2), rng.choice(FINISH_CODES[split])
        script = f"i=0\nwhile [ $i -lt {ticks} ]; do echo {tag}; sleep 0.2; i=$((i+1)); done\nexit {code}\n"
        status = str(code)
    else:
        split = TIMEOUT_SPLITS[case]
        script = f"while true; do echo {tag}; sleep 0.2; done\n"
        status = {"endless": "124", "kill": "137", "preserve": "143"}[case]
    how = {"kill": " sending it SIGKILL (`timeout -s KILL`)",
           "preserve": " with `--preserve-status` (timeout then returns the program's own status)"}.get(case, "")
    flag = {"kill": "-s KILL ", "preserve": "--preserve-status "}.get(case, "")
    other = "124" if status != "124" else "0"
    return ShellProblem(
        prompt=f"Run {name} with sh under a time limit of {secs} second(s) using the `timeout` "
               f"command{how}, then write the exit status that `timeout` returned to status.txt.",
        files={name: script},
        args={"files": {"status.txt": f"{status}\n"}},
        oracle=[f"<bash>timeout {flag}{secs} sh {name} > /dev/null; echo $? > status.txt; cat status.txt</bash>",
                submit("")],
        wrong={"other-status": [f'<write path="status.txt">{other}\n</write>', submit("")],
               "not-run": ['<write path="status.txt">\n</write>', submit("")]},
        split=split)


def env_var(rng: random.Random) -> ShellProblem:
    var = rng.choice(["MODE", "STAGE", "PROFILE", "TARGET"])
    value = word(rng)
    script = f'echo "report for ${{{var}:-default}}"\necho "generated {ident(rng)}"\n'
    out = f"report for {value}\n" + script.split("\n")[1].replace('echo "', "").rstrip('"') + "\n"
    default = out.replace(f"for {value}", "for default")
    return ShellProblem(
        prompt=f"Run report.sh with sh with the environment variable {var} set to {value}, and "
               f"save what it prints (stdout) to report.txt.",
        files={"report.sh": script}, args={"files": {"report.txt": out}},
        oracle=[f"<bash>{var}={value} sh report.sh > report.txt; cat report.txt</bash>", submit("")],
        wrong={"no-variable": ["<bash>sh report.sh > report.txt</bash>", submit("")],
               "written": [f'<write path="report.txt">{default}</write>', submit("")]})


def tar_logs(rng: random.Random) -> ShellProblem:
    files = {f"logs/{word(rng)}{i}.log": text([f"{word(rng)} {ident(rng)}" for _ in range(3)])
             for i in range(rng.randint(2, 5))}
    files["other.txt"] = "not in the archive\n"
    members = {p: c for p, c in files.items() if p.startswith("logs/")}
    name = rng.choice(["logs.tar.gz", "backup.tar.gz", "archive.tgz"])
    return ShellProblem(
        prompt=f"Create a gzip-compressed tar archive {name} of the directory logs/ (member paths "
               f"must start with logs/, e.g. logs/x.log). Nothing else goes in.",
        files=files, check=TAR_CHECK, args={"path": name, "members": members},
        oracle=[f"<bash>tar czf {name} logs && tar tzf {name}</bash>", submit("")],
        wrong={"flat": [f"<bash>cd logs && tar czf ../{name} *</bash>", submit("")],
               "everything": [f"<bash>tar czf /tmp/{name} . && mv /tmp/{name} .</bash>", submit("")]})


DOMAINS = (
    ("perm.executable", executable, "make scripts executable"),
    ("perm.private", private, "restrict permissions of secret files"),
    ("proc.exit-codes", exit_codes, "collect exit statuses of scripts"),
    ("proc.timeout", timeout_status, "run a process under a time limit"),
    ("proc.env", env_var, "run a script with an environment variable"),
    ("archive.tar", tar_logs, "create a tar.gz of a directory"),
)
