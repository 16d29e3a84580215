"""Find, count and grep domains (`terminal.count.*`, `terminal.find.*`, `terminal.grep.*`)."""

from __future__ import annotations

import random

from posttrain.tasks.families.terminal.common import LEVELS, ShellProblem, ident, ip, log_lines, submit, text, word


def count_matching(rng: random.Random) -> ShellProblem:
    lines = log_lines(rng, rng.randint(12, 40))
    level = rng.choice(LEVELS)
    n = sum(1 for ln in lines if f" {level} " in ln)
    loose = sum(1 for ln in lines if level.lower() in ln.lower())
    return ShellProblem(
        prompt=f"How many lines of app.log have the level {level} (the word {level} in capitals "
               f"after the time)? Submit just the number.",
        files={"app.log": text(lines)}, args={"answer": n, "answer_kind": "int"},
        oracle=[f"<bash>grep -c ' {level} ' app.log</bash>", submit(n)],
        wrong={"case-insensitive": [submit(loose if loose != n else n + 2)],
               "off-by-one": [submit(n + 1)]})


def _tree(rng: random.Random, exts: tuple[str, ...], n: int) -> dict[str, str]:
    dirs = ["", "a/", "a/b/", "c/", "c/d/e/"]
    files: dict[str, str] = {}
    while len(files) < n:
        files[f"logs/{rng.choice(dirs)}{word(rng)}-{rng.randint(1, 99)}.{rng.choice(exts)}"] = f"{ident(rng)}\n"
    return files


def count_files(rng: random.Random) -> ShellProblem:
    files = _tree(rng, ("log", "txt", "gz", "log.1"), rng.randint(8, 20))
    ext = rng.choice(["log", "txt"])
    n = sum(1 for p in files if p.endswith("." + ext))
    top = sum(1 for p in files if p.endswith("." + ext) and p.count("/") == 1)
    return ShellProblem(
        prompt=f"How many files ending in .{ext} are there under logs/, in all subdirectories? "
               f"Submit just the number.",
        files=files, args={"answer": n, "answer_kind": "int"},
        oracle=[f"<bash>find logs -type f -name '*.{ext}' | wc -l</bash>", submit(n)],
        wrong={"top-level-only": [submit(top if top != n else n + 1)]})


def largest(rng: random.Random) -> ShellProblem:
    sizes = rng.sample(range(10, 400), rng.randint(5, 9))
    files = {f"data/{word(rng)}{i}.bin": "x" * (s - 1) + "\n" for i, s in enumerate(sizes)}
    by_size = sorted(files, key=lambda p: len(files[p]))
    return ShellProblem(
        prompt="Which file under data/ is the largest (in bytes)? Submit its path relative to "
               "the workspace, e.g. data/name.bin.",
        files=files, args={"answer": by_size[-1], "answer_kind": "path"},
        oracle=["<bash>ls -S data | head -1</bash>", submit(by_size[-1])],
        wrong={"smallest": [submit(by_size[0])], "second": [submit(by_size[-2])]})


def containing(rng: random.Random) -> ShellProblem:
    code = f"token-{ident(rng, 8)}"
    paths = [f"docs/{d}{word(rng)}-{i}.md" for i, d in enumerate(rng.choices(["", "x/", "y/z/"], k=rng.randint(5, 10)))]
    files = {p: text([" ".join(word(rng) for _ in range(6)) for _ in range(4)]) for p in paths}
    target = rng.choice(paths)
    near = rng.choice([p for p in paths if p != target])
    files[target] = files[target] + f"see {code} here\n"
    files[near] = files[near] + f"see {code[:-1]} there\n"  # a near miss
    return ShellProblem(
        prompt=f"Exactly one file under docs/ contains the text {code}. Submit its path relative "
               f"to the workspace.",
        files=files, args={"answer": target, "answer_kind": "path"},
        oracle=[f"<bash>grep -rl '{code}' docs</bash>", submit(target)],
        wrong={"near-miss": [submit(near)]})


def count_words(rng: random.Random) -> ShellProblem:
    lines = [" ".join(word(rng) for _ in range(rng.randint(0, 9))) for _ in range(rng.randint(3, 12))]
    n = sum(len(ln.split()) for ln in lines)
    return ShellProblem(
        prompt="How many words (whitespace-separated) does story.txt contain? Submit just the number.",
        files={"story.txt": text(lines)}, args={"answer": n, "answer_kind": "int"},
        oracle=["<bash>wc -w < story.txt</bash>", submit(n)],
        wrong={"lines": [submit(len(lines) if len(lines) != n else n + 1)]})


def unique_ips(rng: random.Random) -> ShellProblem:
    lines = [f"{ip(rng)} - - GET /{word(rng)} {rng.choice([200, 404, 500])}" for _ in range(rng.randint(8, 30))]
    n = len({ln.split()[0] for ln in lines})
    return ShellProblem(
        prompt="access.log has one request per line, the client IP first. How many distinct "
               "client IPs are there? Submit just the number.",
        files={"access.log": text(lines)}, args={"answer": n, "answer_kind": "int"},
        oracle=["<bash>cut -d' ' -f1 access.log | sort -u | wc -l</bash>", submit(n)],
        wrong={"all-lines": [submit(len(lines) if len(lines) != n else n + 1)]})


def empty_files(rng: random.Random) -> ShellProblem:
    names = sorted({f"data/{word(rng)}{rng.randint(1, 9)}.txt" for _ in range(rng.randint(5, 10))})
    empty = sorted(rng.sample(names, rng.randint(1, len(names) - 1)))
    files = {p: ("" if p in empty else f"{ident(rng)}\n") for p in names}
    return ShellProblem(
        prompt="Write the paths of the empty files under data/ (relative to the workspace, e.g. "
               "data/x.txt), sorted, one per line, to empty.txt.",
        files=files, args={"files": {"empty.txt": text(empty)}},
        oracle=["<bash>find data -type f -empty | sort > empty.txt; cat empty.txt</bash>", submit("")],
        wrong={"all-files": [f'<write path="empty.txt">{text(names)}</write>', submit("")]})


def grep_to_file(rng: random.Random) -> ShellProblem:
    lines = log_lines(rng, rng.randint(15, 40))
    lines.append(f"2024-03-01 13:00:00 INFO retry after {rng.choice(['warn', 'WARNING'])} flag")
    keep = [ln for ln in lines if " WARN " in ln]
    loose = [ln for ln in lines if "warn" in ln.lower()]
    return ShellProblem(
        prompt="Write every line of app.log whose level is WARN (the word WARN in capitals after "
               "the time) to warnings.txt, in their original order.",
        files={"app.log": text(lines)}, args={"files": {"warnings.txt": text(keep)}},
        oracle=["<bash>grep ' WARN ' app.log > warnings.txt; wc -l warnings.txt</bash>", submit("")],
        wrong={"case-insensitive": [f'<write path="warnings.txt">{text(loose)}</write>', submit("")]})


def level_counts(rng: random.Random) -> ShellProblem:
    lines = log_lines(rng, rng.randint(10, 40))
    counts = {lv: sum(1 for ln in lines if ln.split()[2] == lv) for lv in LEVELS}
    want = [f"{lv} {n}" for lv, n in sorted(counts.items()) if n]
    return ShellProblem(
        prompt="Count the lines of app.log per level (the third field: DEBUG, ERROR, INFO or WARN) "
               "and write levels.txt with one line 'LEVEL COUNT' per level that occurs, sorted by "
               "level name.",
        files={"app.log": text(lines)}, args={"files": {"levels.txt": text(want)}},
        oracle=["<bash>cut -d' ' -f3 app.log | sort | uniq -c | while read n level; do echo \"$level $n\"; "
                "done > levels.txt; cat levels.txt</bash>", submit("")],
        wrong={"unsorted": [f'<write path="levels.txt">{text(want[::-1])}</write>', submit("")]}
        if len(want) > 1 else {"missing": [submit("")]})


def move_txt(rng: random.Random) -> ShellProblem:
    names = sorted({f"{word(rng)}{i}" for i in range(rng.randint(4, 9))})
    files, txt = {}, []
    for i, n in enumerate(names):  # at least one .txt and one .md
        ext = "txt" if i == 0 else "md" if i == 1 else rng.choice(["txt", "md", "txt"])
        files[f"inbox/{n}.{ext}"] = f"{ident(rng)}\n"
        if ext == "txt":
            txt.append(n)
    files["archive/README"] = "archived notes\n"
    moved = {f"archive/{n}.txt": files[f"inbox/{n}.txt"] for n in txt}
    others = {p: c for p, c in files.items() if not p.endswith(".txt")}
    return ShellProblem(
        prompt="Move every .txt file from inbox/ into archive/ (same names); leave the other files "
               "where they are.",
        files=files,
        args={"files": {**moved, **others}, "absent": [f"inbox/{n}.txt" for n in txt]},
        oracle=["<bash>mv inbox/*.txt archive/ && ls inbox archive</bash>", submit("")],
        wrong={"copied": ["<bash>cp inbox/*.txt archive/</bash>", submit("")],
               "moved-all": ["<bash>mv inbox/* archive/</bash>", submit("")]})


DOMAINS = (
    ("count.level-lines", count_matching, "count log lines of one level"),
    ("count.files", count_files, "count files by extension in a tree"),
    ("find.largest", largest, "find the largest file"),
    ("find.containing", containing, "find the file containing a token"),
    ("count.words", count_words, "count words in a file"),
    ("count.unique-ips", unique_ips, "count distinct client IPs in an access log"),
    ("find.empty", empty_files, "list empty files"),
    ("grep.to-file", grep_to_file, "extract matching lines to a file"),
    ("grep.level-counts", level_counts, "count lines per log level"),
    ("files.move", move_txt, "move files by extension"),
)
