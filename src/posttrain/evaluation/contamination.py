"""Train/eval contamination: exact and near-duplicate overlap between two task sets.

Before training, the training job calls

    report = check_contamination(train_tasks, eval_tasks)
    guard_training(report, run_dir, allow=False)      # raises ContaminationError if eval leaked;
                                                      # writes RUN/contamination.json either way

What is compared, per task: its `prompt`, its `files` (paths and contents), its `reference` and its
verifier settings (`tests`), each normalized (Unicode NFKC, lower case, runs of whitespace to one
space).

* **exact**: an eval task whose problem (prompt + files, compared *with* its letter case: in
  "swapcase aBc=" or in code the case is the problem, so "aBc" and "AbC" are two problems) equals
  a training task's, or whose
  reference or tests equal a training task's and are at least `min_exact_chars` long (short
  answers such as "85" coincide by chance and are not a leak on their own);
* **near**: a field close to the same field of a training task. Its character shingles are split
  into the domain's template and the rest (the residual): a shingle is template when it is in more
  than half of the domain's tasks (one template) or in more than `template_df_low` of them and at
  least `template_min_count` (a generator with a few templates, none in half of its tasks, like
  reasoning-gym's aiw), for domains with enough tasks to tell. The similarity is the shared
  residual shingles over those plus the symmetric difference of the two fields' shingles:
  template text the two share is no evidence of copying, template text that differs is still a
  difference. Two different problems of one template (other numbers, other names) are therefore
  not near-duplicates; the same long prose with a word or a number changed, or a training prompt
  inside an eval prompt with a little text around it, is (at `threshold` 0.8).
  Shingles are `ngram` characters; a field with fewer than `min_informative` residual shingles
  at that size (a board of two or three symbols: every 5-character window of a 0/1 board is one
  of a dozen patterns, shared by every board) is compared with the shortest of `long_ngrams`
  (20 or 40) at which its domain's fields stay informative, so two boards share few shingles
  by chance. On a board a near-duplicate is one with a small share of its cells changed: one
  flipped cell of a 16x16 board is one; one of an 8x8 board changes a third of its 20-character
  shingles and counts as another problem. Fields still uninformative at the longest size (a
  short variable part of a template) and texts shorter than `min_chars` are compared exactly.

Why MinHash, and why `datasketch`: comparing every eval field with every training field is
quadratic (10^4 x 10^5 tasks is 10^9 pairs). MinHash LSH (datasketch's `MinHashLSH`, a maintained
library, rather than our own banding code) finds the candidate pairs in near-linear time; every
candidate is then confirmed with its exact similarity (above), so a reported match is never an
artefact of the sketch; candidates are gathered below the threshold (`LSH_MARGIN`), so a pair at
the 0.8 default threshold is found with probability ~0.99 and one at 0.85 with ~0.9999 (misses
are possible, false matches are not). What it does *not* find: paraphrases with few shared character n-grams,
the same problem with renamed variables or reordered operands ("37+48=" vs "48+37="), a training
text inside an eval text with as much other text around it (the similarity is symmetric, not
containment), an eval board inside a longer training prompt (only eval fields are compared at
every shingle size), and one problem written two ways by a templated generator (other names,
an irrelevant number, the same answer): to the guard those are two problems of one template, so
a generator has to keep them in one split itself (the rg family splits aiw, gsm_symbolic,
emoji_mystery and intermediate_integration by the problem, not its wording).
"""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from posttrain.errors import write_text_atomic
from posttrain.values.task import Task, canonical_json

CONTAMINATION_FILE = "contamination.json"
FIELDS = ("prompt", "files", "reference", "tests")
LSH_MARGIN = 0.8
"""LSH candidate threshold as a share of the reported threshold"""


class ContaminationError(RuntimeError):
    """Eval tasks leak into a training set; training refuses to start (overridable)."""


@dataclass(frozen=True)
class ContaminationConfig:
    threshold: float = 0.8
    """Jaccard similarity (of residual shingles) at or above which two fields are near-duplicates"""
    ngram: int = 5
    """character n-gram (shingle) size"""
    num_perm: int = 128
    """MinHash permutations (more: fewer missed candidates, slower)"""
    min_chars: int = 40
    """fields shorter than this (normalized) are compared exactly only"""
    min_exact_chars: int = 64
    """an exact match of a reference or tests field counts only from this length"""
    template_df: float = 0.5
    """a shingle in more than this share of a domain's tasks is template, not content"""
    template_df_low: float = 0.05
    """... or in more than this share and at least `template_min_count` tasks (several templates)"""
    template_min_count: int = 5
    """a shingle in fewer tasks than this is content, whatever the domain's size"""
    template_min_tasks: int = 10
    """domains with fewer tasks (train + eval) keep all their shingles"""
    min_informative: int = 24
    """a field with fewer residual `ngram`-shingles is compared with longer ones (`long_ngrams`)"""
    long_ngrams: tuple[int, ...] = (20, 40)
    """shingle sizes tried, shortest first, for low-information fields (boards of two symbols)"""
    informative_share: float = 0.5
    """a shingle size fits a domain's low-information field when, for the median task, at least
    this share of the field's shingles (and `min_informative`) are left after its template"""

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"ContaminationConfig.threshold must be in (0, 1], got {self.threshold}")
        if self.ngram < 1 or self.num_perm < 16:
            raise ValueError(f"ContaminationConfig: ngram must be >= 1 and num_perm >= 16, "
                             f"got {self.ngram}, {self.num_perm}")
        if not 0 < self.template_df <= 1 or not 0 < self.template_df_low <= self.template_df:
            raise ValueError(f"ContaminationConfig: template_df must be in (0, 1] and template_df_low in "
                             f"(0, template_df], got {self.template_df}, {self.template_df_low}")
        if self.template_min_count < 3 or not self.long_ngrams or min(self.long_ngrams) <= self.ngram:
            raise ValueError(f"ContaminationConfig: template_min_count must be >= 3 (a leaked pair is 2 "
                             f"tasks) and long_ngrams longer than ngram, got {self.template_min_count}, "
                             f"{self.long_ngrams}")
        if self.min_informative < 1 or not 0 < self.informative_share <= 1:
            raise ValueError(f"ContaminationConfig: min_informative must be >= 1 and informative_share in "
                             f"(0, 1], got {self.min_informative}, {self.informative_share}")


@dataclass(frozen=True)
class Match:
    eval_key: str
    eval_hash: str
    eval_domain: str
    train_key: str
    train_hash: str
    train_domain: str
    field: str
    kind: str
    """'exact' or 'near'"""
    similarity: float


@dataclass
class ContaminationReport:
    n_train: int
    n_eval: int
    config: ContaminationConfig
    matches: list[Match] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.matches

    @property
    def leaked_eval_hashes(self) -> set[str]:
        return {m.eval_hash for m in self.matches}

    def by_domain(self) -> dict[str, int]:
        """Eval domain -> number of its eval tasks that leak."""
        seen: dict[str, set[str]] = {}
        for m in self.matches:
            seen.setdefault(m.eval_domain, set()).add(m.eval_hash)
        return {d: len(h) for d, h in sorted(seen.items())}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "n_train": self.n_train, "n_eval": self.n_eval,
                "leaked_eval_tasks": len(self.leaked_eval_hashes),
                "exact": sum(m.kind == "exact" for m in self.matches),
                "near": sum(m.kind == "near" for m in self.matches), "by_domain": self.by_domain(),
                "config": asdict(self.config), "seconds": round(self.seconds, 3),
                "matches": [asdict(m) for m in self.matches]}


def normalize(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def _files_text(task: Task) -> str:
    return "\n".join(f"{p}\n{c}" for p, c in sorted(task.files.items()))


def _fields(task: Task) -> dict[str, str]:
    out = {"prompt": normalize(task.prompt), "files": normalize(_files_text(task)),
           "reference": normalize(canonical_json(task.reference)) if task.reference is not None else "",
           "tests": normalize(canonical_json(task.verifier)) if task.verifier else ""}
    return {k: v for k, v in out.items() if v}


def _problem_digest(task: Task) -> str:
    """The identity of a problem: prompt and files, NFKC and whitespace-normalized, case kept."""
    text = " ".join(unicodedata.normalize("NFKC", task.prompt + "\0" + _files_text(task)).split())
    return _digest(text)


def _shingles(text: str, n: int) -> set[str]:
    return {text[i:i + n] for i in range(len(text) - n + 1)} if len(text) >= n else {text}


def _field_shingles(fields_: Sequence[dict[str, str]], name: str, n: int, i: int) -> set[str]:
    return _shingles(fields_[i][name], n)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _as_tasks(items: Iterable[Any]) -> list[Task]:
    out = []
    for it in items:
        task = it[1] if isinstance(it, tuple) else it
        if not isinstance(task, Task):
            raise TypeError(f"check_contamination takes Tasks or (Domain, Task) pairs, got {type(task).__name__}")
        out.append(task)
    return out


def check_contamination(train_tasks: Iterable[Any], eval_tasks: Iterable[Any], threshold: float = 0.8, *,
                        config: ContaminationConfig | None = None) -> ContaminationReport:
    """Exact and near-duplicate overlap of eval tasks with training tasks (module docstring).

    Tasks may be `Task`s or `(Domain, Task)` pairs. One match is reported per (eval task, field,
    kind): the most similar training task."""
    cfg = config or ContaminationConfig(threshold=threshold)
    started = time.perf_counter()
    train, evals = _as_tasks(train_tasks), _as_tasks(eval_tasks)
    report = ContaminationReport(n_train=len(train), n_eval=len(evals), config=cfg)
    tf = [_fields(t) for t in train]
    ef = [_fields(t) for t in evals]

    # exact: whole problem (prompt + files), then long references / tests. A reference or tests
    # value that most tasks of a domain share (the oracle's commands, the check script, the JSON
    # schema) is the domain's template, not a problem's content: it never counts as a leak.
    shared = _shared_values(train + evals, tf + ef, cfg)
    problem_index: dict[str, int] = {}
    field_index: dict[tuple[str, str], int] = {}
    for i, (t, f) in enumerate(zip(train, tf)):
        problem_index.setdefault(_problem_digest(t), i)
        for name in ("reference", "tests"):
            if len(f.get(name, "")) >= cfg.min_exact_chars:
                field_index.setdefault((name, _digest(f[name])), i)
    found: dict[tuple[str, str, str], Match] = {}

    def add(e: Task, tr: Task, name: str, kind: str, sim: float) -> None:
        if kind == "near" and (e.hash, name, "exact") in found:
            return  # already reported as an exact match of that field
        key = (e.hash, name, kind)
        if key not in found or found[key].similarity < sim:
            found[key] = Match(e.key, e.hash, e.domain, tr.key, tr.hash, tr.domain, name, kind, round(sim, 4))

    for e, f in zip(evals, ef):
        j = problem_index.get(_problem_digest(e))
        if j is not None:
            add(e, train[j], "problem", "exact", 1.0)
        for name in ("reference", "tests"):
            if len(f.get(name, "")) >= cfg.min_exact_chars:
                digest = _digest(f[name])
                j = field_index.get((name, digest))
                if j is not None and (e.domain, name, digest) not in shared:
                    add(e, train[j], name, "exact", 1.0)

    # near: residual shingles (templates removed), MinHash LSH candidates, exact similarity check.
    # First at `ngram` characters; a field left with too little there (a board of two symbols,
    # a short variable part of a template) is compared with longer shingles (`_long_residuals`).
    # One field at a time: the shingle sets of every task are the memory this takes.
    tasks, fields_, n_train = train + evals, tf + ef, len(train)
    by_domain: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_domain.setdefault(t.domain, []).append(i)
    for name in FIELDS:
        short, _ = _residuals(by_domain, fields_, cfg, cfg.ngram, name, None)
        low = {i for i, sh in short.items() if len(sh) < cfg.min_informative}
        passes = [(cfg.ngram, {i: sh for i, sh in short.items() if i not in low}),
                  *_long_residuals(by_domain, fields_, cfg, name, low, n_train)]
        del short
        for n, sets in passes:
            train_sets = {i: sh for i, sh in sets.items() if i < n_train}
            queries = {i: sh for i, sh in sets.items() if i >= n_train}
            full = partial(_field_shingles, fields_, name, n)
            for j, i, sim in _near_pairs(train_sets, queries, full, cfg):
                add(tasks[j], train[i], name, "near", sim)
    # A workspace task is its files: the same question over different files is a different
    # problem, so a task with files leaks only when its files match too.
    files_matched = {m.eval_hash for m in found.values() if m.field in ("files", "problem")}
    with_files = {e.hash for e in evals if e.files}
    kept = [m for m in found.values() if m.eval_hash not in with_files or m.eval_hash in files_matched]
    report.matches = sorted(kept, key=lambda m: (m.eval_domain, m.eval_key, m.field, m.kind))
    report.seconds = time.perf_counter() - started
    return report


def _shared_values(tasks: Sequence[Task], fields_: Sequence[dict[str, str]],
                   cfg: ContaminationConfig) -> set[tuple[str, str, str]]:
    """(domain, field, digest) of reference/tests values found in more than `template_df` of
    that domain's tasks (domains with at least `template_min_tasks` tasks)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    sizes: Counter[str] = Counter(t.domain for t in tasks)
    for t, f in zip(tasks, fields_):
        for name in ("reference", "tests"):
            if name in f:
                counts[(t.domain, name, _digest(f[name]))] += 1
    return {key for key, c in counts.items()
            if sizes[key[0]] >= cfg.template_min_tasks and c > cfg.template_df * sizes[key[0]]}


def _residuals(by_domain: dict[str, list[int]], fields_: Sequence[dict[str, str]], cfg: ContaminationConfig,
               n: int, name: str, only: set[int] | None,
               extra: Iterable[int] = ()) -> tuple[dict[int, set[str]], dict[int, int]]:
    """Task index -> field `name`'s `n`-character shingles less its domain's template at that
    size (`_is_template`, counted over all the domain's tasks), for the tasks whose field has at
    least `min_chars` characters: all of them, or those in `only` (and in `extra`, less a
    template where one of `only` needed it); and task index -> its number of shingles."""
    extras = set(extra)
    out: dict[int, set[str]] = {}
    sizes: dict[int, int] = {}
    for idx in by_domain.values():
        targets = [i for i in idx if (only is None or i in only or i in extras)
                   and len(fields_[i].get(name, "")) >= cfg.min_chars]
        if not targets:
            continue
        sets: dict[int, set[str]] = {}
        template: set[str] = set()
        if len(idx) >= cfg.template_min_tasks and (only is None or any(i in only for i in idx)):
            sets = {i: _shingles(fields_[i][name], n) for i in idx if name in fields_[i]}
            df: Counter[str] = Counter()
            for sh in sets.values():
                df.update(sh)
            template = {s for s, c in df.items() if _is_template(c, len(idx), cfg)}
        for i in targets:
            full = sets[i] if i in sets else _shingles(fields_[i][name], n)
            out[i], sizes[i] = full - template, len(full)
    return out, sizes


def _long_residuals(by_domain: dict[str, list[int]], fields_: Sequence[dict[str, str]], cfg: ContaminationConfig,
                    name: str, low: set[int], n_train: int) -> list[tuple[int, dict[int, set[str]]]]:
    """(shingle size, residuals) for the low-information fields, one size per domain.

    Five characters of a 0/1 board are one of a dozen patterns every board has; twenty are ten
    cells, rare on an 8x8 board, common again on a 16x16 one (it has 480 windows); forty are
    twenty cells, rare on any board. So each domain's field gets the shortest size in
    `long_ngrams` (the longest when none fits) at which its median task keeps
    `informative_share` of its shingles after the template: short enough that one changed
    cell changes few shingles, long enough that two boards share few by chance. Fields still
    below `min_informative` (a short variable part of a template) are compared exactly only.
    Every eval field is a query at every size (eval tasks are few): a training board copied into
    an eval prompt with text around it is informative at five characters, the board is not."""
    groups = {domain: [i for i in idx if i in low] for domain, idx in by_domain.items()}
    groups = {domain: keys for domain, keys in groups.items() if keys}
    evals = [i for idx in by_domain.values() for i in idx if i >= n_train]
    out: list[tuple[int, dict[int, set[str]]]] = []
    for k, n in enumerate(cfg.long_ngrams):
        if not groups:
            break
        residuals, sizes = _residuals(by_domain, fields_, cfg, n, name, set().union(*groups.values()), evals)
        chosen = {i: sh for i, sh in residuals.items() if i >= n_train and len(sh) >= cfg.min_informative}
        for domain, keys in list(groups.items()):
            kept = sorted(len(residuals[i]) / max(1, sizes[i]) for i in keys)
            if kept[len(kept) // 2] >= cfg.informative_share or k == len(cfg.long_ngrams) - 1:
                chosen.update({i: residuals[i] for i in keys if len(residuals[i]) >= cfg.min_informative})
                del groups[domain]
        out.append((n, chosen))
    return out


def _near_pairs(train_sets: dict[int, set[str]], queries: dict[int, set[str]], full: Callable[[int], set[str]],
                cfg: ContaminationConfig) -> Iterable[tuple[int, int, float]]:
    """(eval index, train index, similarity) for every pair at or above the threshold.

    The similarity counts template shingles on one side only as a difference: the shared residual
    shingles over those plus the symmetric difference of the fields' full shingle sets. Template
    text the two share is no evidence of copying, but template text that differs ("at least 5 of"
    against "at least 3 of") is a difference between the problems, common or not. It is at most
    the residuals' Jaccard, so the LSH built on residuals finds every pair it reports."""
    from datasketch import MinHash, MinHashLSH

    if not train_sets or not queries:
        return
    # candidates at a lower similarity than reported, weighted against misses: LSH near its
    # threshold misses pairs by chance, while extra candidates only cost an exact check
    lsh = MinHashLSH(threshold=cfg.threshold * LSH_MARGIN, num_perm=cfg.num_perm, weights=(0.2, 0.8))
    keys = list(train_sets)
    hashes = MinHash.bulk([[s.encode() for s in train_sets[i]] for i in keys], num_perm=cfg.num_perm)
    with lsh.insertion_session() as session:
        for i, mh in zip(keys, hashes):
            session.insert(i, mh)
    qkeys = list(queries)
    qhashes = MinHash.bulk([[s.encode() for s in queries[j]] for j in qkeys], num_perm=cfg.num_perm)
    for j, mh in zip(qkeys, qhashes):
        sh = queries[j]
        for i in lsh.query(mh):
            other = train_sets[i]
            shared = len(sh & other)
            if shared < cfg.threshold * len(sh | other):
                continue  # below the residuals' Jaccard already (and so below the similarity)
            sim = shared / (shared + len(full(i) ^ full(j)))
            if sim >= cfg.threshold:
                yield j, i, sim


def _is_template(count: int, size: int, cfg: ContaminationConfig) -> bool:
    """A shingle in `count` of a domain's `size` tasks is template: in most of them (one
    template), or, in a domain large enough to tell, in a sizeable share (a generator with a
    few templates, none reaching half of its tasks: rg.aiw writes each problem in one of
    several). `template_min_count` keeps a leaked pair (2 tasks) from ever being template."""
    if size < cfg.template_min_tasks:
        return False
    return count > cfg.template_df * size or (count >= cfg.template_min_count and count > cfg.template_df_low * size)


def guard_training(report: ContaminationReport, run_dir: str | Path, *, allow: bool = False,
                   key: str | None = None) -> Path:
    """Record the check in `RUN/contamination.json`; raise ContaminationError when eval tasks leak
    into the training set, unless `allow` (the override is recorded in the same file). `key`, if
    given, names what was checked (`posttrain.pipeline.checks.contamination_key`), so that a
    resumed run can tell the check is already done."""
    path = Path(run_dir) / CONTAMINATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"checked_at": time.time(), "overridden": bool(allow and not report.ok),
            "refused": not report.ok and not allow, **({"key": key} if key else {}), **report.to_dict()}
    write_text_atomic(path, json.dumps(body, indent=1), "the contamination check")
    if not report.ok and not allow:
        by = ", ".join(f"{d} ({n})" for d, n in list(report.by_domain().items())[:10])
        raise ContaminationError(f"{len(report.leaked_eval_hashes)} eval task(s) leak into the training set "
                                 f"({by}); see {path}. Remove them, or override (recorded in the run).")
    return path
