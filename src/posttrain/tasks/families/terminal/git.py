"""Git domains (`terminal.git.*`): build and operate a small repository in the workspace.

Every task starts from plain files (a task's workspace is text files only, so a repository is
created by the policy, not shipped). The check inspects the result with git plumbing
(`rev-parse`, `rev-list`, `ls-tree`, `cat-file`, `for-each-ref`), never `status` or `diff`, with
repository settings that run programs overridden (see `script.py`'s `git` helper).
"""

from __future__ import annotations

import random

from posttrain.tasks.families.terminal.checks import GIT_CHECK
from posttrain.tasks.families.terminal.common import ShellProblem, ident, submit, text, word

PEOPLE = (("Ada Lovelace", "ada@example.com"), ("Alan Turing", "alan@example.com"),
          ("Grace Hopper", "grace@example.com"), ("Edsger Dijkstra", "edsger@example.com"))


def _files(rng: random.Random, n: int) -> dict[str, str]:
    names = {f"{rng.choice(['', 'src/', 'docs/'])}{word(rng)}.{rng.choice(['py', 'md', 'txt'])}" for _ in range(n)}
    return {p: text([f"{word(rng)} {ident(rng)}" for _ in range(rng.randint(1, 3))]) for p in sorted(names)}


def _who(rng: random.Random) -> tuple[str, str, str]:
    name, email = rng.choice(PEOPLE)
    return name, email, f"git -c user.name='{name}' -c user.email={email}"


def init_commit(rng: random.Random) -> ShellProblem:
    files = _files(rng, rng.randint(2, 5))
    name, email, g = _who(rng)
    msg = f"Initial import of {word(rng)}"
    return ShellProblem(
        prompt=f"Make this directory a git repository whose branch is named main, and commit all "
               f"its files in a single commit with the message \"{msg}\" and the author "
               f"{name} <{email}>.",
        files=files, check=GIT_CHECK,
        args={"refs": {"main": {"count": 1, "messages": [msg], "author": f"{name} <{email}>", "tree": files}}},
        oracle=[f"<bash>git init -q -b main && git add -A && {g} commit -q -m '{msg}' && git log --oneline</bash>",
                submit("")],
        wrong={"master": [f"<bash>git init -q -b master && git add -A && {g} commit -q -m '{msg}'</bash>", submit("")],
               "partial": [f"<bash>git init -q -b main && git add {next(iter(files))} && {g} commit -q -m '{msg}'</bash>",
                           submit("")] if len(files) > 1 else
               [f"<bash>git init -q -b main && git add -A && {g} commit -q -m 'wip'</bash>", submit("")]})


def feature_branch(rng: random.Random) -> ShellProblem:
    files = _files(rng, rng.randint(2, 4))
    name, email, g = _who(rng)
    branch = f"feature/{word(rng)}"
    new_file = f"{word(rng)}_{ident(rng, 3)}.txt"
    content = f"{word(rng)} {ident(rng)}\n"
    return ShellProblem(
        prompt=f"Create a git repository on branch main and commit all files with the message "
               f"\"base\" (author {name} <{email}>). Then create the branch {branch} from main and, "
               f"on it only, add a file {new_file} containing the line '{content.strip()}', committed "
               f"with the message \"add {new_file}\". main must not contain {new_file}.",
        files=files, check=GIT_CHECK,
        args={"refs": {"main": {"count": 1, "messages": ["base"], "tree": files},
                       branch: {"count": 2, "messages": [f"add {new_file}", "base"], "parent": "main",
                                "tree": {**files, new_file: content}}}},
        oracle=[f"<bash>git init -q -b main && git add -A && {g} commit -q -m base</bash>",
                f"<bash>git checkout -q -b {branch} && printf '%s\\n' '{content.strip()}' > {new_file} && "
                f"git add {new_file} && {g} commit -q -m 'add {new_file}' && git log --oneline --all</bash>",
                submit("")],
        wrong={"on-main": [f"<bash>git init -q -b main && git add -A && {g} commit -q -m base && "
                           f"printf '%s\\n' '{content.strip()}' > {new_file} && git add {new_file} && "
                           f"{g} commit -q -m 'add {new_file}' && git branch {branch}</bash>", submit("")]})


def ignore(rng: random.Random) -> ShellProblem:
    files = _files(rng, rng.randint(2, 4))
    build = rng.choice(["build", "dist", "out"])
    ext = rng.choice(["log", "tmp", "cache"])
    noise = {f"{word(rng)}.{ext}": "noise\n", f"{build}/{word(rng)}.bin": "binary\n",
             f"src/{word(rng)}.{ext}": "noise\n"}
    gitignore = f"*.{ext}\n{build}/\n"
    _, _, g = _who(rng)
    return ShellProblem(
        prompt=f"Create a git repository on branch main with a .gitignore that ignores every "
               f"*.{ext} file and the {build}/ directory, and commit .gitignore together with all "
               f"the other files (message \"track sources\"). No ignored file may be committed.",
        files={**files, **noise}, check=GIT_CHECK,
        args={"refs": {"main": {"count": 1, "messages": ["track sources"],
                                "tree": {**files, ".gitignore": gitignore}}}},
        oracle=[f"<bash>git init -q -b main && printf '*.{ext}\\n{build}/\\n' > .gitignore && git add -A && "
                f"{g} commit -q -m 'track sources' && git ls-files</bash>", submit("")],
        wrong={"everything": [f"<bash>git init -q -b main && printf '*.{ext}\\n{build}/\\n' > .gitignore && "
                              f"git add -A -f && {g} commit -q -m 'track sources'</bash>", submit("")]})


def tag(rng: random.Random) -> ShellProblem:
    files = _files(rng, rng.randint(1, 3))
    version = f"v{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    note = f"Release {version} {word(rng)}"
    _, _, g = _who(rng)
    return ShellProblem(
        prompt=f"Create a git repository on branch main, commit all files (message \"release\"), "
               f"and create an annotated tag {version} on that commit with the message \"{note}\".",
        files=files, check=GIT_CHECK,
        args={"refs": {"main": {"count": 1, "messages": ["release"], "tree": files}},
              "tags": {version: {"target": "main", "message": note}}},
        oracle=[f"<bash>git init -q -b main && git add -A && {g} commit -q -m release && "
                f"{g} tag -a {version} -m '{note}' && git tag -n</bash>", submit("")],
        wrong={"lightweight": [f"<bash>git init -q -b main && git add -A && {g} commit -q -m release && "
                               f"git tag {version}</bash>", submit("")]})


def two_commits(rng: random.Random) -> ShellProblem:
    files = _files(rng, rng.randint(3, 5))
    ext = rng.choice(sorted({p.rsplit(".", 1)[1] for p in files}))
    first = {p: c for p, c in files.items() if p.endswith("." + ext)}
    if len(first) == len(files):
        files["NOTES"] = "notes\n"
    _, _, g = _who(rng)
    return ShellProblem(
        prompt=f"Create a git repository on branch main with two commits: first only the *.{ext} "
               f"files (in any directory) with the message \"add {ext} files\", then everything "
               f"else with the message \"add the rest\".",
        files=files, check=GIT_CHECK,
        args={"refs": {"main": {"count": 2, "messages": ["add the rest", f"add {ext} files"], "tree": files},
                       "main~1": {"tree": first}}},
        oracle=[f"<bash>git init -q -b main && git add $(find . -name '*.{ext}' -not -path './.git/*') && "
                f"{g} commit -q -m 'add {ext} files' && git add -A && {g} commit -q -m 'add the rest' && "
                f"git log --stat --oneline</bash>", submit("")],
        wrong={"one-commit": [f"<bash>git init -q -b main && git add -A && {g} commit -q -m 'add the rest'</bash>",
                              submit("")],
               "swapped": [f"<bash>git init -q -b main && git add -A && git reset -q $(find . -name '*.{ext}' -not -path './.git/*') ; "
                           f"{g} commit -q -m 'add {ext} files' && git add -A && {g} commit -q -m 'add the rest'</bash>",
                           submit("")]})


DOMAINS = (
    ("git.init-commit", init_commit, "create a repository and commit with a given author"),
    ("git.branch", feature_branch, "commit on a feature branch only"),
    ("git.ignore", ignore, "ignore files with .gitignore"),
    ("git.tag", tag, "create an annotated tag"),
    ("git.two-commits", two_commits, "split files over two commits"),
)
