"""Function templates: one parameterised Python function task, with a reference solution.

A template draws *semantic* parameters (a shift, a window size, a tie rule) that go into the
prompt, and argument lists for hidden test cases. The reference solution (our code, run on the
host) computes the expected return values; the verifier compares them with what the candidate
returns in the sandbox (see `posttrain.verifiers.code`).

Splits are by content: a problem is the template plus its parameters (not its examples or test
inputs), so the same function never appears in both train and eval. A template whose parameters
include a two-way choice that changes its solution by a token (rotate left or right, mask the
first or the last characters) names the parameters that decide the split (`split_by`): the two
functions are near-duplicates (one's wrong version is the other's solution, and the references
the contamination guard compares differ by a word), so they belong to one split.

Every generated task is checked against its plausible wrong solution (and, for repair tasks,
its buggy version): test cases are added until one of them tells the two apart, so the
negatives of every task genuinely fail.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from posttrain.tasks.families.common import content_split, draw_in_split
from posttrain.values.task import Split, canonical_json
from posttrain.verifiers.candidate import encode_value

Params = Mapping[str, Any]


EXTRA_CASE_DRAWS = 400
"""random cases tried to find one that separates the reference from a wrong version"""


@dataclass(frozen=True)
class FunctionTemplate:
    name: str
    """domain suffix, e.g. 'list.rotate' (the domain is 'code.list.rotate')"""
    entry: str
    """the function name"""
    signature: str
    """shown in the prompt, e.g. 'rotate(xs: list[int]) -> list[int]'"""
    params: Callable[[random.Random], dict[str, Any]]
    """draws the semantic parameters (JSON values)"""
    describe: Callable[[Params], str]
    """what the function must do, completing 'that ...'"""
    solution: Callable[[Params], str]
    """reference solution source"""
    wrong: Callable[[Params], str]
    """a plausible wrong solution (a negative)"""
    case: Callable[[random.Random, Params], list[Any]]
    """one random argument list"""
    edge: Callable[[Params], list[list[Any]]] = lambda p: []
    """fixed argument lists always tested (empty inputs, boundaries)"""
    bug: Callable[[Params], tuple[str, str]] | None = None
    """(correct text, buggy text): a one-line bug in `solution`, for a repair variant"""
    n_cases: int = 10
    tags: tuple[str, ...] = field(default=())
    split_by: tuple[str, ...] | None = None
    """the parameters that decide the split (None: all); problems that differ only in the others
    are near-duplicates and share a split"""


@lru_cache(maxsize=4096)
def compile_reference(source: str, entry: str) -> Callable[..., Any]:
    ns: dict[str, Any] = {}
    exec(compile(source, f"<reference {entry}>", "exec"), ns)  # our own reference code
    return ns[entry]


def run_reference(source: str, entry: str, args: list[Any]) -> Any:
    """The encoded return value of `source`'s `entry` on (a deep copy of) `args`; an exception
    is encoded as {'raises': name} (a wrong version that raises is told apart by that)."""
    try:
        return encode_value(compile_reference(source, entry)(*copy.deepcopy(args)))
    except Exception as e:
        return {"raises": type(e).__name__}


def problem_split(template: FunctionTemplate, params: Params) -> Split:
    keys = template.split_by if template.split_by is not None else tuple(params)
    return content_split(f"code/{template.name}\x00{canonical_json({k: params[k] for k in keys})}")


def draw_params(template: FunctionTemplate, domain: str, split: Split, seed: int) -> tuple[dict, random.Random]:
    """Parameters in `split` drawn from the task RNG (which then continues with the cases)."""
    return draw_in_split(domain, split, seed, template.params, lambda params: problem_split(template, params))


@dataclass(frozen=True)
class Cases:
    args: list[list[Any]]
    expected: list[Any]


def make_cases(template: FunctionTemplate, params: Params, rng: random.Random,
               must_fail: tuple[str, ...]) -> Cases:
    """Edge cases plus `n_cases` random ones, extended until each source in `must_fail`
    (wrong or buggy versions) gives a different result on at least one case."""
    ref = template.solution(params)
    args = [list(a) for a in template.edge(params)] + [template.case(rng, params)
                                                        for _ in range(template.n_cases)]
    expected = [run_reference(ref, template.entry, a) for a in args]
    if any(isinstance(e, dict) and "raises" in e for e in expected):
        raise RuntimeError(f"template {template.name}: the reference raised on {args}")
    for bad in must_fail:
        if any(run_reference(bad, template.entry, a) != e for a, e in zip(args, expected)):
            continue
        for _ in range(EXTRA_CASE_DRAWS):
            a = template.case(rng, params)
            e = run_reference(ref, template.entry, a)
            if run_reference(bad, template.entry, a) != e:
                args.append(a)
                expected.append(e)
                break
        else:
            raise RuntimeError(f"template {template.name} {dict(params)}: no case tells the "
                               f"reference from a wrong version apart")
    return Cases(args, expected)


def call_text(entry: str, args: list[Any]) -> str:
    return f"{entry}({', '.join(repr(a) for a in args)})"


def example_lines(template: FunctionTemplate, params: Params, cases: Cases, k: int = 2) -> str:
    """Up to k examples (the first non-trivial cases) as `f(x) == y` lines."""
    ref = compile_reference(template.solution(params), template.entry)
    picked = [a for a in cases.args if any(a)][:k] or cases.args[:k]
    return "\n".join(f"    {call_text(template.entry, a)} == {ref(*copy.deepcopy(a))!r}" for a in picked)
