"""Configuration-file domains (`terminal.config.*`)."""

from __future__ import annotations

import json
import random

from posttrain.tasks.families.terminal.common import ShellProblem, ident, submit, text, word


def _write(path: str, content: str) -> str:
    return f'<write path="{path}">{content}</write>'


def _ini(sections: dict[str, dict[str, str]]) -> str:
    out = []
    for name, items in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {v}" for k, v in items.items()]
        out.append("")
    return text(out).rstrip("\n") + "\n"


def set_key(rng: random.Random) -> ShellProblem:
    sections = {"database": {"host": "db.local", "port": str(rng.randint(5000, 5999)), "user": word(rng)},
                "server": {"host": "0.0.0.0", "port": str(rng.randint(8000, 8999)),
                           "workers": str(rng.randint(1, 8))},
                "cache": {"port": str(rng.randint(6000, 6999)), "ttl": str(rng.randint(10, 600))}}
    target = rng.choice(["server", "cache"])
    new = str(rng.randint(9000, 9999))
    want = json.loads(json.dumps(sections))
    want[target]["port"] = new
    first = json.loads(json.dumps(sections))
    first["database"]["port"] = new
    old = sections[target]["port"]
    return ShellProblem(
        prompt=f"In app.conf, set the port of the [{target}] section to {new}. Change nothing else.",
        files={"app.conf": _ini(sections)}, args={"files": {"app.conf": _ini(want)}},
        oracle=[f'<edit path="app.conf"><old>port = {old}</old><new>port = {new}</new></edit>', submit("")],
        wrong={"first-port": [_write("app.conf", _ini(first)), submit("")]})


def json_key(rng: random.Random) -> ShellProblem:
    doc = {"name": word(rng), "logging": {"level": "info", "file": f"{word(rng)}.log"},
           "features": {word(rng): rng.random() < 0.5 for _ in range(3)},
           "limits": {"rps": rng.randint(10, 500), "burst": rng.randint(1, 50)}}
    path, value = rng.choice([(("logging", "level"), rng.choice(["debug", "warning", "error"])),
                              (("limits", "rps"), rng.randint(600, 999)),
                              (("limits", "burst"), rng.randint(60, 99))])
    want = json.loads(json.dumps(doc))
    want[path[0]][path[1]] = value
    flat = json.loads(json.dumps(doc))
    flat[path[1]] = value  # set at the top level instead of nested
    return ShellProblem(
        prompt=f"In settings.json, set {path[0]}.{path[1]} to {json.dumps(value)} (a JSON "
               f"{'string' if isinstance(value, str) else 'number'}). Keep every other setting.",
        files={"settings.json": json.dumps(doc, indent=2) + "\n"}, args={"json": {"settings.json": want}},
        oracle=["<python>import json\nd = json.load(open('settings.json'))\n"
                f"d[{path[0]!r}][{path[1]!r}] = {value!r}\njson.dump(d, open('settings.json', 'w'), indent=2)\n"
                "print(d)</python>", submit("")],
        wrong={"top-level": [_write("settings.json", json.dumps(flat, indent=2)), submit("")],
               "as-string": [_write("settings.json", json.dumps({**want, path[0]: {**want[path[0]], path[1]: str(value) + " "}}, indent=2)),
                             submit("")]})


def env_merge(rng: random.Random) -> ShellProblem:
    keys = rng.sample(["HOST", "PORT", "DEBUG", "USER", "TOKEN", "REGION", "MODE", "LEVEL"], 6)
    base = {k: ident(rng, 4) for k in keys[:4]}
    override = {k: ident(rng, 4) for k in keys[2:]}
    merged = {**base, **override}
    base_wins = {**override, **base}
    return ShellProblem(
        prompt="Merge base.env and override.env (lines KEY=VALUE) into .env: every key of either "
               "file, the value from override.env when a key is in both, lines sorted by key.",
        files={"base.env": text([f"{k}={v}" for k, v in base.items()]),
               "override.env": text([f"{k}={v}" for k, v in override.items()])},
        args={"files": {".env": text([f"{k}={merged[k]}" for k in sorted(merged)])}},
        oracle=["<bash>cat override.env base.env | sort -t= -k1,1 -u > .env; cat .env</bash>", submit("")],
        wrong={"base-wins": [_write(".env", text([f"{k}={base_wins[k]}" for k in sorted(base_wins)])), submit("")]})


def comment_out(rng: random.Random) -> ShellProblem:
    opts = rng.sample(["compression", "keepalive", "tls", "http2", "gzip", "sendfile", "tcp_nodelay"], 5)
    lines = [f"# {word(rng)} settings"] + [f"{o} {rng.choice(['on', 'off'])};" for o in opts]
    target = rng.choice(opts)
    want = [f"# {ln}" if ln.startswith(target + " ") else ln for ln in lines]
    return ShellProblem(
        prompt=f"Disable the '{target}' line of server.conf by putting '# ' (hash and space) in "
               f"front of it. Leave every other line as it is.",
        files={"server.conf": text(lines)}, args={"files": {"server.conf": text(want)}},
        oracle=[f"<bash>sed -i 's/^{target} /# {target} /' server.conf; cat server.conf</bash>", submit("")],
        wrong={"deleted": [f"<bash>sed -i '/^{target} /d' server.conf</bash>", submit("")]})


DOMAINS = (
    ("config.set-key", set_key, "change one key in one INI section"),
    ("config.json-key", json_key, "set a nested JSON setting"),
    ("config.env-merge", env_merge, "merge two env files"),
    ("config.comment-out", comment_out, "comment out one configuration line"),
)
