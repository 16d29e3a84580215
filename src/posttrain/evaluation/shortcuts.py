"""Did a policy settle on one answer? Each domain's commonest final answer after training, and its
share of the answers before and after.

A policy under RL pressure learns a constant answer wherever one pays (a skewed task set, or a
yes/no-like task it passes below chance) and carries it to prompts that look alike, where it is
mostly wrong: in a 40-step breadth run the trained policy answered "0" to 72% of
`text.count.l8`'s samples, learned on `text.count.l3`. Pass rates hide this until it costs a
domain; the rise of the commonest answer's share shows it directly. `posttrain tasks check`'s
constant-answer probe looks at the task sets; this looks at what a policy did with them.

    with Store.for_run_dir(run_dir, readonly=True) as store:
        shift = answer_shift(final_answers(store, "eval:before"), final_answers(store, "eval:after"))
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

Answers = Mapping[str, Sequence[tuple[str, bool]]]
"""domain -> (final answer, passed) of every scored episode"""


def final_answers(store: Any, run_id: str) -> dict[str, list[tuple[str, bool]]]:
    """domain -> (the last turn's action, stripped; passed) of each scored episode of `run_id`
    (an evaluation's episodes are stored under 'eval:<name>'); infrastructure errors left out."""
    out: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for t in store.trajectories(run_id=run_id):
        if t.passed is None:  # no verdict: an infrastructure error
            continue
        out[t.domain].append((t.turns[-1].action.strip() if t.turns else "", bool(t.passed)))
    return dict(out)


def answer_shift(before: Answers, after: Answers) -> dict[str, dict[str, Any]]:
    """Per domain scored on both sides: the commonest answer after (`answer`), its share of the
    answers before and after (`share_before`, `share_after`, `rise`) and the pass@1 it earns
    after (`pass1_by_answer`) beside the domain's (`pass1_before`, `pass1_after`)."""
    out: dict[str, dict[str, Any]] = {}
    for domain in sorted(set(before) & set(after)):
        b, a = before[domain], after[domain]
        if not b or not a:
            continue
        answer = Counter(x for x, _ in a).most_common(1)[0][0]
        share_b = sum(x == answer for x, _ in b) / len(b)
        share_a = sum(x == answer for x, _ in a) / len(a)
        out[domain] = {"answer": answer, "share_before": round(share_b, 4), "share_after": round(share_a, 4),
                       "rise": round(share_a - share_b, 4),
                       "pass1_before": round(sum(p for _, p in b) / len(b), 4),
                       "pass1_after": round(sum(p for _, p in a) / len(a), 4),
                       "pass1_by_answer": round(sum(x == answer and p for x, p in a) / len(a), 4)}
    return out


def largest_rise(shift: Mapping[str, Mapping[str, Any]], domains: Sequence[str] | None = None
                 ) -> tuple[str | None, float | None]:
    """The domain (of `domains`, default all) whose commonest answer rose most, and the rise."""
    rows = {d: r for d, r in shift.items() if domains is None or d in domains}
    if not rows:
        return None, None
    worst = max(rows, key=lambda d: (rows[d]["rise"], d))
    return worst, rows[worst]["rise"]
