"""The `rg` family: reasoning-gym's procedural generators as domains `rg.<name>`.

Each generator becomes one `single`-answer domain with reasoning-gym's default configuration.
A task is one dataset item: the prompt is the item's question verbatim, and the reference stores
what `score_answer` needs (the item's answer and metadata, as JSON) plus where it came from
(generator name, item key, reasoning-gym version).

Reward: reasoning-gym's `score_answer` gives wrong answers small partial credit (0.01 for a
parsable answer, 0.05 for a well-formed wrong grid, a share for an answer containing the right
one). We threshold it: **passed iff score >= 1.0** (`PASS_THRESHOLD`); the verdict's score is
then 1.0 or 0.0 and the raw score is kept in `details["rg_score"]`.

Answers: the completion is stripped; if it contains `<answer>...</answer>` (reasoning-gym's own
convention for chat models) the content of the last such tag is graded, otherwise the whole
text. Answers may span several lines (grids), so these domains set no stop string.

Skipped generators (see `SKIPPED`), probed offline with reasoning-gym 0.1.25: none needs the
network; four have no usable oracle or verifier, one is not reproducible, one is too slow,
one is a meta-dataset. Configurations are reasoning-gym's defaults except `CONFIG`.

Cost: most items take well under 10 ms; a few puzzle generators run a solver per item
(zebra_puzzles, word_ladder and puzzle24 ~0.45 s on one busy core). An eval task draws ~5
items on average (20% of items are eval), a train task ~1.25.

Scorer fixes (`rg_answers`): answers a scorer would evaluate as code must have their
generator's form; scoring runs in a grading child process with a timeout; full credit from a
too-lenient scorer faces an exact check (puzzle24, countdown, gsm_symbolic, coin_flip,
number_sorting, pool_matrix); answers with nan/inf are refused before any scorer sees them; ARC
boards are turned back into tuples before scoring (`RESTORE`); generators that draw from the
global `random`/numpy state are seeded per item and the caller's state restored; reasoning-gym's
modules see a fixed day when they ask for today (`rg_clock`).

Splits: an item belongs to the split its question's content hashes to, so one question is only
ever in one split; for generators that write one problem several ways (other names, emoji or
irrelevant numbers) the problem's identity decides instead (`SPLIT_KEY`).

What this does *not* do: audit reasoning-gym's scorers beyond our oracle/negative self-test, or
expose generator configurations (difficulty) as separate domains.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Strata, content_split, draw_in_split, perturb
from posttrain.tasks.families.rg_answers import EXTRA_CHECKS, FORMS, non_finite
from posttrain.tasks.families.rg_clock import fixed_clock_reasoning_gym
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict
from posttrain.verifiers.worker import GradingWorker

RG_VERSION = "0.1.25"
"""the reasoning-gym version the generator list and the fixes below were checked against"""

PASS_THRESHOLD = 1.0
"""a reasoning-gym score at or above this passes; anything below (partial credit) fails"""

BASE_SEED = 20250101
"""seed of the one dataset object per generator; items are addressed by key"""

SKIPPED: dict[str, str] = {
    "composite": "a meta-dataset: needs a list of other datasets to mix",
    "boxnet": "items have no reference answer (the scorer simulates plans); no oracle",
    "rush_hour": "items have no reference solution, only the minimum move count; no oracle",
    "game_of_life_halting": "score_answer is bool(answer) == bool(reference): any non-empty text passes",
    "propositional_logic": "premises are often contradictory, and then every well-formed non-trivial "
                           "formula is scored as a valid conclusion (negations of the answer pass)",
    "knight_swap": "too slow to generate: 0.5-6 s per item (a search per puzzle), whatever the config",
    # Generation that iterates over sets of strings depends on Python's hash seed: the same seed
    # gives another task in another process (a Ray worker, a resumed run), so it cannot be replayed.
    "isomorphic_strings": "not reproducible across processes (depends on PYTHONHASHSEED)",
    "polynomial_multiplication": "not reproducible across processes (depends on PYTHONHASHSEED)",
    "ransom_note": "not reproducible across processes (depends on PYTHONHASHSEED)",
    "word_ladder": "not reproducible across processes (depends on PYTHONHASHSEED)",
    "codeio": "computes answers by exec-ing bundled code snippets in our process; their outputs are "
              "not reproducible (the same item differs between calls)",
}

# Generators whose items must be addressed by a per-seed dataset of size 1 (their
# __getitem__ refuses an index past the dataset size).
PER_SEED = frozenset({"acre", "gsm_symbolic", "list_functions", "word_ladder"})

# Generators whose items carry no answer but whose metadata holds a valid example solution.
ORACLE_FROM_METADATA: dict[str, Callable[[dict], str]] = {
    "graph_color": lambda m: json.dumps(m["possible_answer"]),
    "rubiks_cube": lambda m: m["example_correct_answer"],
}


def _tuple_boards(entry: dict) -> dict:
    """ARC scorers compare the parsed answer with `metadata['output']` as tuples of tuples;
    JSON turned them into lists."""
    meta = dict(entry["metadata"])
    for k in ("input", "output"):
        if k in meta:
            meta[k] = tuple(tuple(row) for row in meta[k])
    return {**entry, "metadata": meta}


# Generators where another problem's answer may validly solve this one too (a colouring of
# another graph may colour this one): no 'other_problem' negative.
MANY_ANSWERS = frozenset({"graph_color"})


def _clashing_colouring(answer: str, entry: dict) -> str:
    """The example colouring with the two ends of the first edge given the same colour (or, in
    a graph without edges, a colour that is not allowed)."""
    colouring, puzzle = json.loads(answer), entry["metadata"]["puzzle"]
    if puzzle["edges"]:
        u, v = puzzle["edges"][0]
        colouring[str(v)] = colouring[str(u)]
    else:
        colouring[next(iter(colouring))] = max(puzzle["color_options"]) + 1
    return json.dumps(colouring)


# Wrong answers for generators with many valid answers, where editing a character of the
# example answer may well give another valid one: (answer, entry) -> surely wrong answer.
WRONG: dict[str, Callable[[str, dict], str]] = {"graph_color": _clashing_colouring}

# Non-default configurations: futoshiki boards up to 9x9 cost ~1.3 s per item (up to 5 s);
# up to 6x6 they cost ~50 ms.
CONFIG: dict[str, dict[str, Any]] = {"futoshiki": {"max_board_size": 6}}

# Metadata a generator keeps that restates the answer at length and that no scorer reads
# (count_primes lists every prime of the range). Two different problems with overlapping inputs
# (ranges 1203-8515 and 1523-8489) then share most of their stored reference, and the
# contamination guard rightly cannot tell them from one problem; the reference keeps only what
# scoring needs. Checked against reasoning-gym 0.1.25's `score_answer` of each generator.
UNSCORED_METADATA: dict[str, tuple[str, ...]] = {"count_primes": ("primes",)}

def _gsm_template(item: dict) -> str:
    """gsm_symbolic instantiates ~100 templates with other names and numbers (GSM-Symbolic's
    point: one template is one problem); its variables' names identify the template."""
    return " ".join(sorted(item["metadata"]["variables"]))


def _names_masked(item: dict) -> str:
    """aiw's problem is its template and numbers; the names are decoration."""
    return re.sub(r"[A-Z][a-z]+", "_", item["question"])


# What decides an item's split where its question is not the problem's identity: the same
# problem written with another name, emoji, verb or irrelevant number ("Linda has 5 sisters
# ..." / "Patricia has 5 sisters ..."; one sentence under two emoji; "Evaluate"/"Find the
# indefinite integral of" one integrand; popcorn popping 22 or 12 seconds at a time) went to
# both splits, and the contamination guard found the eval copy. Here the answer (a large space),
# the template or the question without its names decides, so one problem is only ever in one
# split (and gsm_symbolic's eval templates are unseen in training).
SPLIT_KEY: dict[str, Callable[[dict], str]] = {
    "aiw": _names_masked,
    "emoji_mystery": lambda item: str(item["answer"]),
    "gsm_symbolic": _gsm_template,
    "intermediate_integration": lambda item: str(item["answer"]),
}

# Undo what a JSON round trip changed, where a scorer cares.
RESTORE: dict[str, Callable[[dict], dict]] = {"arc_agi": _tuple_boards, "rearc": _tuple_boards}

NAMES: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic",
    "bf", "binary_alternation", "binary_matrix", "bitwise_arithmetic", "boxnet", "caesar_cipher",
    "calendar_arithmetic", "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation",
    "complex_arithmetic", "composite", "count_bits", "count_primes", "countdown", "course_schedule",
    "cryptarithm", "decimal_arithmetic", "decimal_chain_sum", "dice", "emoji_mystery",
    "family_relationships", "figlet_font", "fraction_simplification", "futoshiki", "game_of_life",
    "game_of_life_halting", "gcd", "graph_color", "group_anagrams", "gsm_symbolic",
    "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves",
    "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble", "list_functions",
    "mahjong_puzzle", "manipulate_matrix", "maze", "mini_sudoku", "modulo_grid", "n_queens",
    "needle_haystack", "number_filtering", "number_format", "number_sequence", "number_sorting",
    "palindrome_generation", "palindrome_partitioning", "path_star", "polynomial_equations",
    "polynomial_multiplication", "pool_matrix", "power_function", "prime_factorization", "products",
    "propositional_logic", "puzzle24", "quantum_lock", "ransom_note", "rearc", "rectangle_count",
    "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference", "sentence_reordering",
    "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting",
    "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego",
    "word_ladder", "word_sequence_reversal", "word_sorting", "zebra_puzzles",
)
"""reasoning-gym 0.1.25's generators, listed here so that `posttrain tasks list` does not pay
the 2-3 s import of reasoning-gym; with another installed version the list is read from it"""

LIMITS = TaskLimits(max_turns=1, max_tokens=1024, context_tokens=8192)


@contextlib.contextmanager
def _quiet():
    """Some generators and scorers print or warn (numpy loadtxt, invalid moves); keep it off
    our stdout, which may be carrying JSON."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


@cache
def _dataset(name: str, seed: int = BASE_SEED):
    reasoning_gym = fixed_clock_reasoning_gym()

    with _quiet():
        return reasoning_gym.create_dataset(name, size=1, seed=seed, **CONFIG.get(name, {}))


@contextlib.contextmanager
def _seeded_globals(key: int):
    """A few generators (codeio, list_functions) draw from the global `random`/numpy state;
    seed both from the item key for the call, then put the caller's state back."""
    import random

    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(key)
    np.random.seed(key % 2 ** 32)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _item(name: str, key: int) -> dict:
    with _quiet(), _seeded_globals(key):
        if name in PER_SEED:
            reasoning_gym = fixed_clock_reasoning_gym()
            # not cached: one dataset object per key would grow without bound
            return reasoning_gym.create_dataset(name, size=1, seed=key, **CONFIG.get(name, {}))[0]
        return _dataset(name)[key]


def _oracle_answer(name: str, item: dict) -> str:
    if item.get("answer") is not None:
        return str(item["answer"])
    return str(ORACLE_FROM_METADATA[name](item["metadata"]))


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The graded part of a completion: the last `<answer>` tag's content, else the text."""
    tags = _ANSWER_TAG.findall(text)
    return (tags[-1] if tags else text).strip()


RG_TIMEOUT_S = 10.0
"""wall budget of one scoring in the grading child (most take well under 10 ms; sympy's
`simplify` of an honest integration answer up to ~1 s on a busy core)"""


def _scorer_setup() -> dict[str, Any]:
    """In the grading child: reasoning-gym imported (paid once); datasets made on first use."""
    fixed_clock_reasoning_gym()
    return {}


def _scorer_call(state: dict[str, Any], request: tuple[str, str, dict]) -> float:
    """In the grading child: reasoning-gym's own `score_answer` of one answer."""
    gen, answer, entry = request
    with _quiet():
        return float(_dataset(gen).score_answer(answer, entry))


_WORKER = GradingWorker(_scorer_setup, _scorer_call, "posttrain-rg-scorer")


@dataclass(frozen=True)
class RGScore:
    """reasoning-gym's own `score_answer`, thresholded at `PASS_THRESHOLD`, behind the checks of
    `rg_answers` (an attacked scorer's faults, by class).

    Before scoring, an answer fails that has a non-finite number (nan, inf) or, for a scorer that
    evaluates it, is not of its generator's form (`FORMS`). Scoring runs in a grading child
    process; an answer that makes the scorer raise, return a score outside [0, 1], outlive
    `RG_TIMEOUT_S` or kill the child fails (the answer decides these: a policy could otherwise
    turn any wrong answer into a dropped, retried infrastructure error). A full-credit score then
    faces the generator's extra check (`EXTRA_CHECKS`) where its scorer is too lenient."""

    name: str = "rg"
    version: str = f"3+rg{RG_VERSION}"
    needs_sandbox: bool = False

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        ref = task.reference
        try:
            gen, entry = ref["rg"]["name"], ref["entry"]
        except (TypeError, KeyError) as e:
            raise VerifierError(f"task {task.key}: reference lacks reasoning-gym data ({e})") from e
        if outcome.answer is None:
            return verdict(self, False, reason="no answer")
        answer = extract_answer(outcome.answer)
        if not answer:
            return verdict(self, False, reason="empty answer")
        if non_finite(answer) and not non_finite(str(ref.get("answer", ""))):
            # before scoring: some scorers turn NaN into full credit (min(1, exp(-nan)) is 1)
            return verdict(self, False, reason="the answer has a non-finite number (nan/inf)")
        form = FORMS.get(gen)
        if form is not None and (why := form(answer, entry)) is not None:
            return verdict(self, False, reason=f"not the form {gen}'s scorer evaluates: {why}")
        entry = RESTORE.get(gen, lambda e: e)(entry)
        score, why = _WORKER.judged((gen, answer, entry), RG_TIMEOUT_S)
        if why is not None:  # the policy's answer can make a scorer raise or hang: a failure, not infra
            return verdict(self, False, reason=f"reasoning-gym's scorer rejected the answer: {why}")
        if not 0.0 <= score <= 1.0:  # also catches NaN; the answer made the scorer misbehave
            return verdict(self, False, reason=f"reasoning-gym's scorer returned {score} for the answer")
        passed = score >= PASS_THRESHOLD
        extra = EXTRA_CHECKS.get(gen)
        if passed and extra is not None and not extra(answer, entry):
            return verdict(self, False, rg_score=score, threshold=PASS_THRESHOLD,
                           reason=f"fails posttrain's extra check for {gen}: "
                                  f"{(extra.__doc__ or '').split(':')[0].strip()}")
        return verdict(self, passed, rg_score=score, threshold=PASS_THRESHOLD)


RG_SCORE = RGScore()


def _generator_names() -> list[str]:
    try:
        installed = version("reasoning_gym")
    except Exception:  # not installed: the family has no domains
        return []
    if installed == RG_VERSION:
        names = NAMES
    else:
        from reasoning_gym.factory import DATASETS

        names = tuple(sorted(DATASETS))
    return [n for n in names if n not in SKIPPED]


_BOOL_FLIP = {"true": "False", "false": "True", "yes": "No", "no": "Yes"}
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?\d+\.\d+")


def _wrong_answer(answer: str) -> str:
    """A plausible wrong answer of the same shape: a flipped boolean, an integer plus one, a
    decimal doubled plus one, or the first digit/letter changed (grids, lists, words)."""
    a = answer.strip()
    if a.lower() in _BOOL_FLIP:
        return _BOOL_FLIP[a.lower()]
    if _INT.fullmatch(a):
        return str(int(a) + 1)
    if _FLOAT.fullmatch(a):  # doubled: scorers use relative tolerances
        return f"{float(a) * 2 + 1:.{len(a.split('.')[1])}f}"
    return perturb(a[::-1])[::-1]  # perturb() edits the last letter/digit: reversed, the first


# -- answer caps and strata ------------------------------------------------------------------
# Some generators are skewed: `syllogism` answers "Yes" 70% of the time, `circuit_logic` "0" 60%,
# `shortest_path` "infeasible" 34%. A policy under RL pressure learns the commonest answer long
# before the task (`posttrain tasks check`'s constant-answer probe calls such a domain guessable),
# and the shortcut spills into look-alike domains. We cannot change the generators, so the task
# draw thins the over-represented answers: an item whose answer has share p in the generator's
# output (above the cap c) is kept with probability c / p, so each answer ends at share
# min(p, c) / Z. And some repeat a few problems so often (`self_reference`: one question in ten
# eval draws) that the hash split leaves the two splits with different answer shares: those draw
# their answer class first (`common.strata_of`). Both are measured once per reasoning-gym version
# (`posttrain.tasks.families.rg_caps`, `python -m posttrain.tasks.families.rg_caps`) and
# shipped in ANSWER_CAPS_FILE: measuring them at run time would cost every process ~1,400
# generated items per domain.

ANSWER_CAPS_FILE = Path(__file__).with_name("rg_answer_caps.json")


@cache
def _shipped_table() -> dict[str, Any]:
    table = json.loads(ANSWER_CAPS_FILE.read_text())
    if table.get("reasoning_gym") != RG_VERSION:
        raise RuntimeError(f"{ANSWER_CAPS_FILE.name} was measured on reasoning-gym {table.get('reasoning_gym')}, "
                           f"this module is for {RG_VERSION}: measure it again "
                           "(python -m posttrain.tasks.families.rg_caps)")
    return dict(table)


def _shipped_caps() -> dict[str, Any]:
    return dict(_shipped_table()["caps"])


@cache
def _shipped_strata() -> dict[str, Strata]:
    return {name: Strata.from_json(obj) for name, obj in _shipped_table().get("strata", {}).items()}


def thinned_draw(name: str) -> Callable[[random.Random], tuple[int, dict]]:
    """Draw (key, item) of a generator, its over-represented answers thinned (ANSWER_CAPS_FILE)."""
    caps = _shipped_caps().get(name)

    def draw(rng: random.Random) -> tuple[int, dict]:
        while True:
            key = rng.randrange(2 ** 31)
            item = _item(name, key)
            if caps is None:
                return key, item
            share = caps["shares"].get(_oracle_answer(name, item).strip())
            if share is None or rng.random() < caps["cap"] / share:
                return key, item
    return draw


def item_split(name: str, drawn: tuple[int, dict]) -> Split | None:
    """The split of a drawn item. One whose reference answer is empty (a rubiks_cube scramble
    that cancels out) cannot tell an empty answer from a right one, and one whose answer lacks
    its generator's form cannot be answered (intermediate_integration's `Integral(...)`, which
    sympy could not integrate: restating the question): it belongs to no split, draw another."""
    item = drawn[1]
    answer = _oracle_answer(name, item).strip()
    form = FORMS.get(name)
    if not answer or (form is not None and form(answer, item) is not None):
        return None
    return content_split(SPLIT_KEY[name](item) if name in SPLIT_KEY else item["question"])


def drawn_answer(name: str, drawn: tuple[int, dict]) -> str:
    return _oracle_answer(name, drawn[1]).strip()


def _make(name: str) -> Domain:
    domain_name = f"rg.{name}"

    def generate(seed: int, split: Split) -> Task:
        # a generator whose splits were measured to differ in their answers' shares (a few
        # problems drawn very often: `self_reference`) draws its answer class first (STRATA)
        strata = _shipped_strata().get(name)
        (key, item), _ = draw_in_split(domain_name, split, seed, thinned_draw(name),
                                       lambda drawn: item_split(name, drawn), strata,
                                       lambda drawn: drawn_answer(name, drawn))
        # default=str: some generators keep exact values in their metadata (gsm_symbolic's
        # `Fraction` variables); as text they stay informative, and no scorer reads them
        dropped = UNSCORED_METADATA.get(name, ())
        metadata = {k: v for k, v in item["metadata"].items() if k not in dropped}
        entry = json.loads(json.dumps({"answer": item.get("answer"), "metadata": metadata},
                                      allow_nan=False, default=str))
        reference = {"answer": _oracle_answer(name, item), "entry": entry,
                     "rg": {"name": name, "key": key, "version": RG_VERSION}}
        return Task(domain=domain_name, prompt=item["question"], reference=reference, env="single",
                    limits=LIMITS, split=split, tags=("rg",), seed=seed)

    def oracle(task: Task) -> list[str]:
        return [task.reference["answer"]]

    def negatives(task: Task) -> dict[str, list[str]]:
        answer = task.reference["answer"]
        make_wrong = WRONG.get(name)
        wrong = make_wrong(answer, task.reference["entry"]) if make_wrong else _wrong_answer(answer)
        out = {"empty": [""], "wrong": [wrong]}
        if name in MANY_ANSWERS:
            return out
        other = _oracle_answer(name, _item(name, (task.reference["rg"]["key"] + 1) % 2 ** 31))
        if other.strip() != answer.strip():
            out["other_problem"] = [other]  # the answer to a neighbouring problem
        return out

    return Domain(name=domain_name, family="rg", env="single", verifier=RG_SCORE, generate=generate,
                  oracle=oracle, negatives=negatives, description=f"reasoning-gym generator {name!r}",
                  tags=("rg",), stop=())


def domains() -> list[Domain]:
    return [_make(n) for n in _generator_names()]
