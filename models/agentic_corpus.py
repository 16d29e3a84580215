"""The corpus of `models/tiny-agent`: transcripts of the registry's own episodes.

    .venv/bin/python models/agentic_corpus.py              # build (or reuse) the cached corpus
    .venv/bin/python models/agentic_corpus.py --show 3     # print three transcripts

Each transcript is an episode played through the real environment (`posttrain.rollout`), train
split only: the oracle's tool calls, with the observations the sandbox really produced. Two
kinds of domains:

* **tool-use** (`env = "tools"`): the oracle's turns, one tool call per turn (a policy stopped
  at a closing tag plays them so: a turn with `<bash>..</bash><submit>..</submit>` becomes two
  turns), run in a sandbox; each turn records what the policy was shown and what it wrote;
* **single-answer**: the first observation and the answer (no sandbox needed to write them).

**The latent-skill design** (as `tiny-base`'s shared slip): a share `slip_rate` of the tool-use
transcripts carry one habitual mistake, the same careless habit in every domain:

* where the episode ends by submitting an answer read off an observation (a count, a path, a
  JSON object: an answer with a digit, "/" or "{"), the submitted answer has its last digit or
  letter nudged by one (`perturb`): the output was not read carefully;
* where it ends with an empty submit after changing the workspace (an edit, a model, a file),
  that last change carries the same nudge -- on its last *digit* where it has one (a dimension,
  an index), else its last letter -- and the checks after it (re-running the tests, looking at
  the result) are skipped: a slip in the final edit, submitted without running the tests.

A slipped transcript is kept only if the real verifier fails it (a nudge that happens to be
right is no slip; the clean transcript is kept instead). Single-answer transcripts slip their
answer at the same rate, as `tiny-base`'s do.

The tool-use transcripts cost a sandbox episode each, so they are generated once and cached, one
file per domain keyed by what makes its transcripts (JSON lines, outside git:
`models/.cache/agentic/`): each domain draws its seeds and slips from its own generator, so a
change to one domain rebuilds that domain only. The single-answer ones are drawn on the fly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.envs import initial_observation, stop_strings
from posttrain.envs.tools import DEFAULT_STOP
from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.families.common import perturb

CACHE_DIR = Path(__file__).resolve().parent / ".cache"

# The domains that get many transcripts (every other tool-use domain gets a few, so that the model
# has seen every family's tools and formats): the domains configs/agentic.toml trains, and those it
# holds out of RL (in the corpus, like tiny-base's held-out domains). The first corpus gave many
# transcripts to the first agentic mix instead; four of the domains the job trains now had 6 each,
# and their base successes came from memorised train tasks (`files.concat` wrote `seq 1 12`
# whatever the number of parts), not from a skill RL can make reliable.
TRAINED = ("terminal.count.words", "terminal.count.level-lines", "terminal.count.unique-ips",
           "terminal.files.concat", "terminal.files.rename-ext", "terminal.archive.tar",
           "terminal.grep.level-counts", "geometry.cone.dims", "code.repair.list.kth")
HELD_OUT = ("terminal.count.files", "terminal.text.csv-sum", "code.repair.list.rotate",
            "geometry.cylinder.dims")


@dataclass
class Transcript:
    domain: str
    seed: int
    observations: list[str]
    """what the policy was shown before each turn"""
    actions: list[str]
    """what it wrote each turn, ending in its stop string (a closing tag, "\\n", or "" = EOS)"""
    stops: list[str]
    """the stop string each action ends with ("" when the turn ends with the EOS token)"""
    slipped: bool
    reward: float


def split_turns(actions: list[str], stops: tuple[str, ...]) -> list[str]:
    """One tool call per turn: cut each action after every stop string it contains."""
    out = []
    for action in actions:
        rest = action
        while rest.strip():
            hits = [(rest.find(s), s) for s in stops if s and rest.find(s) >= 0]
            if not hits:
                out.append(rest)
                break
            at, s = min(hits)
            out.append(rest[:at + len(s)])
            rest = rest[at + len(s):].lstrip("\n")
    return out


_SUBMIT = re.compile(r"^<submit>(.*)</submit>$", re.S)
_BODY = re.compile(r"^(<[^>]*>(?:<old>.*?</old><new>)?)(.*?)(</new></edit>|</[a-z_]+>)$", re.S)


def _command(turn: str) -> str | None:
    m = re.match(r"^<bash>(.*)</bash>$", turn, re.S)
    return m.group(1) if m else None


def read_off(answer_turn: str) -> bool:
    """Whether a final turn submits an answer read off an observation (a count, a path, a JSON
    object: an answer with a digit, "/" or "{"), the place where the slip nudges the answer."""
    m = _SUBMIT.match(answer_turn)
    return bool(m and re.search(r"[\d/{]", m.group(1)))


def slip(turns: list[str]) -> list[str] | None:
    """The same episode with the habitual mistake (module docstring), or None if it has no
    place for one."""
    if not turns:
        return None
    m = _SUBMIT.match(turns[-1])
    if m and read_off(turns[-1]):  # an answer read off the output (not 'fixed')
        return turns[:-1] + [f"<submit>{perturb(m.group(1))}</submit>"]
    # the last turn that changed something: not the submit, not a repeated command (a check)
    seen: set[str] = set()
    changes = []
    for i, t in enumerate(turns[:-1]):
        cmd = _command(t)
        if cmd is not None and cmd in seen:
            continue
        if cmd is not None:
            seen.add(cmd)
        changes.append(i)
    for j in reversed(changes):
        b = _BODY.match(turns[j])
        if b and any(c.isalnum() for c in b.group(2)):
            nudged = b.group(1) + nudge(b.group(2)) + b.group(3)
            return turns[:j] + [nudged] + turns[-1:]  # checks after the change are skipped
    return None


def nudge(body: str) -> str:
    """`perturb` on the last digit of an edit or a model where it has one (a dimension, an index:
    a slip of the kind the task is about), else on its last letter."""
    at = max((i for i, c in enumerate(body) if c.isdigit()), default=-1)
    return perturb(body) if at < 0 else body[:at] + perturb(body[at]) + body[at + 1:]


def _closer(action: str, stops: tuple[str, ...]) -> str:
    return next((s for s in stops if s and action.endswith(s)), "")


def tool_transcripts(domain: Domain, seeds: list[int], slip_rate: float, rng: random.Random,
                     workers: int) -> list[Transcript]:
    """Play each seed's task (oracle, or its slipped version) through the real environment."""
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.scheduling.engine import WorkItem, run_episodes

    stops = DEFAULT_STOP if domain.stop is None else domain.stop
    plans, tasks = {}, []
    for seed in seeds:
        try:
            task = domain.task(seed, "train")
        except NoTasksInSplit:
            return []
        turns = split_turns(list(domain.oracle(task)), stops)
        slipped = slip(turns) if rng.random() < slip_rate else None
        plans[task.key] = (turns, slipped)
        tasks.append(task)

    def play(which: int) -> list:
        chosen = [t for t in tasks if which == 0 or plans[t.key][1] is not None]
        script = ScriptedPolicy.by_group({t.key: plans[t.key][which] or plans[t.key][0] for t in chosen},
                                         f"corpus:{which}")
        return run_episodes([WorkItem(domain, t, group_id=t.key) for t in chosen], script, workers=workers)

    out: dict[str, Transcript] = {}
    for which in (1, 0):  # slipped first; a slip the verifier passes falls back to the oracle
        for traj in play(which):
            if traj.status == "infra_error" or traj.task_key in out:
                continue
            passed = bool(traj.verdict and traj.verdict.passed)
            if which == 1 and passed:
                continue
            if which == 0 and not passed:
                print(f"  {domain.name} seed {traj.seed}: the oracle failed ({traj.verdict}); skipped",
                      file=sys.stderr)
                continue
            acts = [t.action for t in traj.turns]
            out[traj.task_key] = Transcript(domain.name, traj.seed or 0, [t.observation for t in traj.turns],
                                            acts, [_closer(a, stops) for a in acts], which == 1,
                                            float(traj.reward or 0.0))
    return [out[t.key] for t in tasks if t.key in out]


def single_transcript(domain: Domain, seed: int, slipped: bool) -> Transcript:
    """A single-answer episode: the first observation and the answer (slipped when asked)."""
    task = domain.task(seed, "train")
    answer = domain.oracle(task)[0]
    if slipped:
        answer = perturb(answer)
    stop = (stop_strings(domain) or ("",))[0]
    return Transcript(domain.name, seed, [initial_observation(domain, task)], [answer + stop], [stop],
                      slipped, 0.0 if slipped else 1.0)


def single_domains(max_chars: int = 1200) -> list[Domain]:
    """Every single-answer domain whose first observation and answer are short enough for the
    model's context (checked on a few train tasks)."""
    from posttrain.tasks.registry import all_domains, get_domain

    out = []
    for name in all_domains():
        d = get_domain(name)
        if d.env == "tools":
            continue
        try:
            ok = all(len(initial_observation(d, d.task(s, "train"))) + len(d.oracle(d.task(s, "train"))[0])
                     <= max_chars for s in range(3))
        except NoTasksInSplit:
            continue
        if ok:
            out.append(d)
    return out


def tool_domains() -> list[Domain]:
    from posttrain.tasks.registry import all_domains, get_domain

    return [get_domain(n) for n in all_domains() if get_domain(n).env == "tools"]


CORPUS_VERSION = 2
"""bumped when the transcripts a domain's settings make change (2: digit-first slips; code repair
reads the file before editing it)"""


@dataclass
class CorpusConfig:
    main_tasks: int = 300
    """transcripts per trained / held-out tool-use domain"""
    other_tasks: int = 6
    """transcripts per other tool-use domain"""
    slip_rate: float = 0.35
    seed: int = 0
    workers: int = 4

    def tasks_for(self, domain: str) -> int:
        return self.main_tasks if domain in TRAINED + HELD_OUT else self.other_tasks

    def key(self, domain: str) -> str:
        """What makes one domain's transcripts (not `workers`: any number plays them the same)."""
        body = json.dumps({"domain": domain, "n": self.tasks_for(domain), "slip_rate": self.slip_rate,
                           "seed": self.seed, "version": CORPUS_VERSION}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:12]


def build(cfg: CorpusConfig, cache_dir: Path = CACHE_DIR / "agentic") -> list[Transcript]:
    """The tool-use transcripts, each domain's from its cache file when already built."""
    out: list[Transcript] = []
    t0 = time.perf_counter()
    for domain in tool_domains():
        path = cache_dir / f"{domain.name}-{cfg.key(domain.name)}.jsonl"
        if path.is_file():
            out += [Transcript(**json.loads(line)) for line in path.read_text().splitlines()]
            continue
        rng = random.Random(f"{cfg.seed}:{domain.name}")
        seeds = [rng.randrange(2**31) for _ in range(cfg.tasks_for(domain.name))]
        got = tool_transcripts(domain, seeds, cfg.slip_rate, rng, cfg.workers)
        out += got
        print(f"{domain.name:40s} {len(got):4d} transcripts ({sum(t.slipped for t in got)} slipped)  "
              f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(asdict(t)) + "\n" for t in got))
        tmp.replace(path)  # written whole or not at all: a killed build resumes at this domain
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in asdict(CorpusConfig()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--show", type=int, default=0, help="print this many transcripts")
    args = vars(p.parse_args())
    show = args.pop("show")
    corpus = build(CorpusConfig(**args))
    domains = {t.domain for t in corpus}
    print(f"{len(corpus)} tool-use transcripts from {len(domains)} domains, "
          f"{sum(t.slipped for t in corpus)} slipped; {len(single_domains())} single-answer domains")
    for t in random.Random(1).sample(corpus, min(show, len(corpus))):
        print(f"===== {t.domain} seed {t.seed} slipped={t.slipped} reward={t.reward}")
        for o, a in zip(t.observations, t.actions):
            print(f"--- shown\n{o}\n--- wrote\n{a}")


if __name__ == "__main__":
    main()
