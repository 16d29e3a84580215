"""Check scripts of the terminal family (run by the `script` verifier inside the sandbox).

Each is Python source defining `check(answer, args)`; the helpers it calls (`read_text`, `info`,
`git`, `Fail`, ...) are provided by `posttrain.verifiers.script.CHECK_PROGRAM`. `args` holds the
hidden expected state, sent on stdin at grading time.
"""

from __future__ import annotations

# JSON compared by type: 1 is not True is not 1.0 (Python's == says they are all equal).
SAME_JSON = r'''
def same_json(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return a == b


def load_json(text):
    """The JSON value of a text, or None; NaN/Infinity and absurd nesting are refused."""
    def _constant(name):
        raise ValueError(name)
    try:
        return json.loads(text, parse_constant=_constant), True
    except (ValueError, RecursionError):
        return None, False
'''

STATE_CHECK = SAME_JSON + r'''
def _norm(text):
    # trailing spaces and trailing newlines never matter; everything else does
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


def check(answer, args):
    problems = []
    want = args.get("answer")
    if want is not None:
        got = answer.strip()
        kind = args.get("answer_kind", "text")
        if kind == "int":
            try:
                ok = int(got) == int(want)
            except ValueError:
                ok = False
        elif kind == "path":
            ok = bool(got) and os.path.normpath(got) == os.path.normpath(want)
        else:
            ok = got == str(want)
        if not ok:
            problems.append(f"the answer {got[:80]!r} is not the expected one")
    for path, text in (args.get("files") or {}).items():
        got = read_text(path)
        if got is None:
            problems.append(f"{path}: missing (or not a regular file)")
        elif _norm(got) != _norm(text):
            problems.append(f"{path}: wrong content")
    for path, obj in (args.get("json") or {}).items():
        got = read_text(path)
        value, parsed = load_json(got) if got is not None else (None, False)
        if not (parsed and same_json(value, obj)):
            problems.append(f"{path}: missing, not JSON, or not the expected value")
    for path in args.get("absent") or []:
        if info(path) is not None:
            problems.append(f"{path}: should not exist")
    for path, mode in (args.get("modes") or {}).items():
        i = info(path)
        if i is None or i["type"] not in ("file", "dir") or i["mode"] != mode:
            have = oct(i["mode"]) if i and i["type"] in ("file", "dir") else "missing"
            problems.append(f"{path}: mode {have}, expected {oct(mode)}")
    return {"passed": not problems, "problems": problems[:8]}
'''

GIT_CHECK = r'''
def _git(*a):
    code, out, err = git(*a)
    if code != 0:
        raise Fail(f"git {' '.join(a)} failed: {err.strip()[:200]}")
    return out


def _norm(text):
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


def check(answer, args):
    i = info(".git")
    if i is None or i["type"] != "dir":
        raise Fail("the workspace is not a git repository (no .git directory)")
    problems = []
    for ref, spec in args.get("refs", {}).items():
        code, out, _ = git("rev-parse", "--verify", "-q", ref + "^{commit}")
        if code != 0:
            problems.append(f"no branch {ref}")
            continue
        if "count" in spec and int(_git("rev-list", "--count", ref)) != spec["count"]:
            problems.append(f"{ref}: expected {spec['count']} commit(s)")
        if "messages" in spec:
            got = [m.strip() for m in _git("log", "--format=%s", ref).strip().split("\n")]
            if got != spec["messages"]:
                problems.append(f"{ref}: commit messages {got[:5]}")
        if "author" in spec and _git("log", "-1", "--format=%an <%ae>", ref).strip() != spec["author"]:
            problems.append(f"{ref}: wrong author")
        if "tree" in spec:
            paths = sorted(p for p in _git("ls-tree", "-r", "--name-only", ref).split("\n") if p)
            if paths != sorted(spec["tree"]):
                problems.append(f"{ref}: tracked files {paths[:10]}")
            else:
                for path, text in spec["tree"].items():
                    if _norm(_git("cat-file", "-p", f"{ref}:{path}")) != _norm(text):
                        problems.append(f"{ref}: {path} has the wrong content")
        if "parent" in spec:
            want = _git("rev-parse", spec["parent"] + "^{commit}").strip()
            if _git("rev-parse", ref + "~1").strip() != want:
                problems.append(f"{ref}: its parent is not {spec['parent']}")
    for tag, spec in args.get("tags", {}).items():
        code, out, _ = git("cat-file", "-t", f"refs/tags/{tag}")
        if code != 0 or out.strip() != "tag":
            problems.append(f"no annotated tag {tag}")
            continue
        if _git("rev-parse", f"{tag}^{{commit}}").strip() != _git("rev-parse", spec["target"]).strip():
            problems.append(f"tag {tag} does not point at {spec['target']}")
        msg = _git("for-each-ref", f"refs/tags/{tag}", "--format=%(contents:subject)").strip()
        if msg != spec["message"]:
            problems.append(f"tag {tag} has message {msg[:80]!r}")
    return {"passed": not problems, "problems": problems[:8]}
'''

TAR_CHECK = r'''
import io, tarfile

# The archive must be of the asked format (no guessing with "r:*": a plain tar named .tar.gz
# is wrong) and hold only regular files and the directories above them: a symlink, hard link,
# device or FIFO member, or a name given twice, fails instead of being skipped.
_MODES = {"gz": "r:gz", "bz2": "r:bz2", "xz": "r:xz", "tar": "r:"}


def _format(path):
    if path.endswith((".tar.gz", ".tgz")):
        return "gz"
    if path.endswith((".tar.bz2", ".tbz2")):
        return "bz2"
    if path.endswith((".tar.xz", ".txz")):
        return "xz"
    return "tar"


def check(answer, args):
    data = read_bytes(args["path"], 1 << 20)
    if data is None:
        raise Fail(f"{args['path']} is missing")
    fmt = args.get("format") or _format(args["path"])
    magic = {"gz": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}.get(fmt)
    if magic is not None and not data.startswith(magic):
        raise Fail(f"{args['path']} is not a {fmt}-compressed archive")
    want = args["members"]
    parents = {"/".join(n.split("/")[:i]) for n in want for i in range(1, n.count("/") + 1)}
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode=_MODES[fmt])
        members, total = {}, 0
        with tf:
            for m in tf.getmembers()[:2000]:
                name = m.name[2:] if m.name.startswith("./") else m.name
                name = name.rstrip("/")
                if m.isdir() and name in parents | {"", "."}:
                    continue
                if not m.isfile():
                    raise Fail(f"member {name!r} is not a regular file (type {m.type!r})")
                if name in members:
                    raise Fail(f"member {name!r} appears twice")
                total += m.size
                if total > 8 << 20:
                    raise Fail("the archive holds more than 8 MiB")
                members[name] = tf.extractfile(m).read().decode("utf-8", "replace")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Fail(f"{args['path']} is not a readable {fmt} tar archive: {type(e).__name__}")
    if sorted(members) != sorted(want):
        return {"passed": False, "problems": [f"archive members {sorted(members)[:10]}"]}
    bad = [n for n in want if members[n].strip() != want[n].strip()]
    return {"passed": not bad, "problems": [f"{n}: wrong content" for n in bad[:8]]}
'''
