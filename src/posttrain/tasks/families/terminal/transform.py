"""Text and file transformation domains (`terminal.text.*`, `terminal.files.*`)."""

from __future__ import annotations

import json
import random

from posttrain.tasks.families.terminal.common import WORDS, ShellProblem, ident, submit, text, word


def _write(path: str, content: str) -> str:
    return f'<write path="{path}">{content}</write>'


def sort_numeric(rng: random.Random) -> ShellProblem:
    nums = [rng.randint(-50, 2000) for _ in range(rng.randint(6, 15))]
    desc = rng.random() < 0.5
    want = sorted(nums, reverse=desc)
    lexical = sorted((str(n) for n in nums), reverse=desc)
    if lexical == [str(n) for n in want]:
        nums.append(rng.choice([7, 70, 700]) + 1000)  # make a lexical sort differ
        want, lexical = sorted(nums, reverse=desc), sorted((str(n) for n in nums), reverse=desc)
    order = "largest first" if desc else "smallest first"
    return ShellProblem(
        prompt=f"numbers.txt has one integer per line. Write them sorted numerically, {order}, "
               f"one per line, to sorted.txt.",
        files={"numbers.txt": text([str(n) for n in nums])},
        args={"files": {"sorted.txt": text([str(n) for n in want])}},
        oracle=[f"<bash>sort -n{'r' if desc else ''} numbers.txt > sorted.txt; head -3 sorted.txt</bash>", submit("")],
        wrong={"lexical": [_write("sorted.txt", text(lexical)), submit("")]})


def _csv(rng: random.Random) -> tuple[list[str], list[list[str]]]:
    header = rng.sample(["id", "name", "city", "score", "age", "team"], 4)
    rows = []
    for i in range(rng.randint(4, 10)):
        row = []
        for h in header:
            row.append(str(i + 1) if h == "id" else word(rng) if h in ("name", "city", "team")
                       else str(rng.randint(1, 99)))
        rows.append(row)
    return header, rows


def csv_column(rng: random.Random) -> ShellProblem:
    header, rows = _csv(rng)
    k = rng.randrange(len(header))
    col = [r[k] for r in rows]
    other = [r[(k + 1) % len(header)] for r in rows]
    return ShellProblem(
        prompt=f"data.csv is comma-separated with a header line. Write the values of the column "
               f"'{header[k]}' (without the header), one per line, to column.txt.",
        files={"data.csv": text([",".join(header)] + [",".join(r) for r in rows])},
        args={"files": {"column.txt": text(col)}},
        oracle=[f"<bash>tail -n +2 data.csv | cut -d, -f{k + 1} > column.txt; cat column.txt</bash>", submit("")],
        wrong={"next-column": [_write("column.txt", text(other)), submit("")],
               "with-header": [_write("column.txt", text([header[k]] + col)), submit("")]})


def csv_sum(rng: random.Random) -> ShellProblem:
    header = ["item", "qty", "price"]
    rows = [[word(rng), str(rng.randint(1, 20)), str(rng.randint(1, 500))] for _ in range(rng.randint(4, 12))]
    k = rng.choice([1, 2])
    total = sum(int(r[k]) for r in rows)
    return ShellProblem(
        prompt=f"What is the sum of the '{header[k]}' column of orders.csv (comma-separated, with "
               f"a header line)? Submit just the number.",
        files={"orders.csv": text([",".join(header)] + [",".join(r) for r in rows])},
        args={"answer": total, "answer_kind": "int"},
        oracle=[f"<bash>echo $(( $(tail -n +2 orders.csv | cut -d, -f{k + 1} | paste -sd+) ))</bash>", submit(total)],
        wrong={"no-last-row": [submit(total - int(rows[-1][k]))]})


def uppercase(rng: random.Random) -> ShellProblem:
    lines = [" ".join(word(rng) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(2, 8))]
    return ShellProblem(
        prompt="Convert notes.txt to uppercase, in place (the file keeps its name).",
        files={"notes.txt": text(lines)}, args={"files": {"notes.txt": text([ln.upper() for ln in lines])}},
        oracle=["<bash>tr a-z A-Z < notes.txt > notes.tmp && mv notes.tmp notes.txt && cat notes.txt</bash>",
                submit("")],
        wrong={"first-line": [_write("notes.txt", text([lines[0].upper()] + lines[1:])), submit("")]})


def replace_word(rng: random.Random) -> ShellProblem:
    old, new = rng.sample(["colour", "centre", "metre", "theatre", "grey", "catalogue"], 2)
    files = {}
    for i in range(rng.randint(2, 5)):
        ext = "md" if i == 0 else rng.choice(["md", "txt"])
        files[f"docs/{word(rng)}{i}.{ext}"] = text([f"the {old} of {word(rng)}", f"{word(rng)} {old} {old}."])
    if not any(p.endswith(".txt") for p in files):
        files["docs/keep.txt"] = f"{old} stays here\n"
    want = {p: (c.replace(old, new) if p.endswith(".md") else c) for p, c in files.items()}
    return ShellProblem(
        prompt=f"Replace every occurrence of '{old}' with '{new}' in the .md files under docs/. "
               f"Do not change any other file.",
        files=files, args={"files": want},
        oracle=[f"<bash>sed -i 's/{old}/{new}/g' docs/*.md && grep -c {new} docs/*.md</bash>", submit("")],
        wrong={"all-files": [f"<bash>sed -i 's/{old}/{new}/g' docs/*</bash>", submit("")],
               "first-only": [f"<bash>sed -i 's/{old}/{new}/' docs/*.md</bash>", submit("")]})


def dedupe(rng: random.Random) -> ShellProblem:
    pool = rng.sample(WORDS, rng.randint(3, 7))
    lines = [rng.choice(pool) for _ in range(rng.randint(8, 20))]
    lines.insert(rng.randint(0, 2), max(pool))  # an early line that sorts last: order matters
    seen, uniq = set(), []
    for ln in lines:
        if ln not in seen:
            seen.add(ln)
            uniq.append(ln)
    return ShellProblem(
        prompt="Write the lines of words.txt to unique.txt without duplicates, keeping the first "
               "occurrence of each line in its original order.",
        files={"words.txt": text(lines)}, args={"files": {"unique.txt": text(uniq)}},
        oracle=["<python>lines = open('words.txt').read().splitlines()\n"
                "open('unique.txt', 'w').write(''.join(x + '\\n' for x in dict.fromkeys(lines)))</python>",
                submit("")],
        wrong={"sorted": ["<bash>sort -u words.txt > unique.txt</bash>", submit("")]})


def join_files(rng: random.Random) -> ShellProblem:
    ids = rng.sample(range(1, 60), rng.randint(4, 8))
    names = {i: word(rng) for i in ids}
    scores = {i: rng.randint(0, 100) for i in ids}
    users = sorted(ids, key=lambda _: rng.random())
    score_order = sorted(ids, key=lambda _: rng.random())
    want = [f"{names[i]},{scores[i]}" for i in sorted(ids)]
    wrong = [f"{names[i]},{scores[j]}" for i, j in zip(sorted(ids), score_order)]
    return ShellProblem(
        prompt="users.csv has lines 'id,name' and scores.csv lines 'id,score' (no headers, same ids, "
               "different order). Write joined.csv with one line 'name,score' per id, in increasing "
               "numeric order of id.",
        files={"users.csv": text([f"{i},{names[i]}" for i in users]),
               "scores.csv": text([f"{i},{scores[i]}" for i in score_order])},
        args={"files": {"joined.csv": text(want)}},
        oracle=["<python>u = dict(l.split(',') for l in open('users.csv').read().split())\n"
                "s = dict(l.split(',') for l in open('scores.csv').read().split())\n"
                "open('joined.csv', 'w').write(''.join(f'{u[i]},{s[i]}\\n' for i in sorted(u, key=int)))\n"
                "print(open('joined.csv').read())</python>", submit("")],
        wrong={"unjoined": [_write("joined.csv", text(wrong)), submit("")]} if wrong != want
        else {"missing-line": [_write("joined.csv", text(want[:-1])), submit("")]})


def jsonl_field(rng: random.Random) -> ShellProblem:
    kinds = ["login", "logout", "purchase"]
    events = [{"type": rng.choice(kinds), "user": word(rng), "n": rng.randint(1, 9)} for _ in range(rng.randint(6, 16))]
    kind = rng.choice([e["type"] for e in events])
    want = [str(e["user"]) for e in events if e["type"] == kind]
    return ShellProblem(
        prompt=f"events.jsonl has one JSON object per line. Write the 'user' field of every event "
               f"whose 'type' is '{kind}', in file order, one per line, to users.txt.",
        files={"events.jsonl": text([json.dumps(e) for e in events])},
        args={"files": {"users.txt": text(want)}},
        oracle=["<python>import json\nrows = [json.loads(l) for l in open('events.jsonl')]\n"
                f"open('users.txt', 'w').write(''.join(r['user'] + '\\n' for r in rows if r['type'] == {kind!r}))"
                "</python>", submit("")],
        wrong={"all-types": [_write("users.txt", text([str(e["user"]) for e in events])), submit("")]}
        if len(want) < len(events) else {"reversed": [_write("users.txt", text(want[::-1] + ["x"])), submit("")]})


def rename_ext(rng: random.Random) -> ShellProblem:
    names = sorted({f"{word(rng)}{i}" for i in range(rng.randint(3, 7))})
    files = {f"photos/{n}.jpeg": f"jpeg-{ident(rng)}\n" for n in names}
    files["photos/keep.png"] = "png\n"
    want = {f"photos/{n}.jpg": files[f"photos/{n}.jpeg"] for n in names} | {"photos/keep.png": "png\n"}
    return ShellProblem(
        prompt="Rename every .jpeg file in photos/ to the same name ending in .jpg.",
        files=files, args={"files": want, "absent": [f"photos/{n}.jpeg" for n in names]},
        oracle=["<bash>cd photos && for f in *.jpeg; do mv \"$f\" \"${f%.jpeg}.jpg\"; done; ls</bash>", submit("")],
        wrong={"copied": ["<bash>cd photos && for f in *.jpeg; do cp \"$f\" \"${f%.jpeg}.jpg\"; done</bash>", submit("")]})


def concat_parts(rng: random.Random) -> ShellProblem:
    n = rng.randint(10, 14)
    parts = {f"parts/part{i}.txt": f"{i}:{ident(rng, 4)}\n" for i in range(1, n + 1)}
    want = "".join(parts[f"parts/part{i}.txt"] for i in range(1, n + 1))
    return ShellProblem(
        prompt=f"parts/ holds part1.txt to part{n}.txt. Concatenate them in numeric order (part1, "
               f"part2, ..., part{n}) into full.txt.",
        files=parts, args={"files": {"full.txt": want}},
        oracle=[f"<bash>for i in $(seq 1 {n}); do cat parts/part$i.txt; done > full.txt; head -3 full.txt</bash>",
                submit("")],
        wrong={"glob-order": ["<bash>cat parts/part*.txt > full.txt</bash>", submit("")]})


def slice_lines(rng: random.Random) -> ShellProblem:
    lines = [f"line {i} {word(rng)}" for i in range(1, rng.randint(20, 40))]
    a = rng.randint(2, 10)
    b = a + rng.randint(2, 8)
    return ShellProblem(
        prompt=f"Write lines {a} to {b} of big.txt (counting from 1, both included) to slice.txt.",
        files={"big.txt": text(lines)}, args={"files": {"slice.txt": text(lines[a - 1:b])}},
        oracle=[f"<bash>sed -n '{a},{b}p' big.txt > slice.txt; cat slice.txt</bash>", submit("")],
        wrong={"off-by-one": [f"<bash>sed -n '{a},{b - 1}p' big.txt > slice.txt</bash>", submit("")]})


def line_counts(rng: random.Random) -> ShellProblem:
    names = sorted({f"{word(rng)}.txt" for _ in range(rng.randint(3, 6))})
    files = {f"notes/{n}": text([word(rng) for _ in range(rng.randint(0, 9))]) for n in names}
    want = [f"{n} {files[f'notes/{n}'].count(chr(10))}" for n in names]
    return ShellProblem(
        prompt="For every .txt file in notes/, write a line 'NAME COUNT' (the file name without "
               "the directory, and its number of lines) to counts.txt, sorted by name.",
        files=files, args={"files": {"counts.txt": text(want)}},
        oracle=["<bash>cd notes && for f in *.txt; do echo \"$f $(wc -l < $f)\"; done > ../counts.txt; "
                "cat ../counts.txt</bash>", submit("")],
        wrong={"with-dir": [_write("counts.txt", text([f"notes/{w}" for w in want])), submit("")]})


DOMAINS = (
    ("text.sort-numeric", sort_numeric, "sort numbers numerically"),
    ("text.csv-column", csv_column, "extract a CSV column"),
    ("text.csv-sum", csv_sum, "sum a CSV column"),
    ("text.uppercase", uppercase, "uppercase a file in place"),
    ("text.replace", replace_word, "replace a word in some files only"),
    ("text.dedupe", dedupe, "remove duplicate lines keeping order"),
    ("text.join", join_files, "join two files on a key"),
    ("text.jsonl-field", jsonl_field, "extract a field from JSON lines"),
    ("files.rename-ext", rename_ext, "rename files by extension"),
    ("files.concat", concat_parts, "concatenate parts in numeric order"),
    ("text.slice", slice_lines, "extract a range of lines"),
    ("text.line-counts", line_counts, "count lines per file"),
)
