"""What the policy's answer may look like before a reasoning-gym scorer sees it, and the checks
we add after a scorer that is too lenient.

reasoning-gym's scorers were written for honest models. Under RL they are attacked, and three
classes of fault were found by playing an adversary against them (reasoning-gym 0.1.25):

* **Scorers that evaluate the answer as code.** `eval(answer)` (binary_matrix, spiral_matrix,
  string_insertion, n_queens: a partial-credit path) and `sympy.parse_expr(answer)` (the
  integrations, countdown, puzzle24; sympy's parser runs `eval`) execute whatever the answer
  says: `__import__('os')...` wrote files from the grading process, and one answer that patched
  our threshold made every later answer pass. Each such generator has an answer **form**
  (`FORMS`): a check of the answer's characters and names that admits the honest answers and
  nothing that can call, import or reach an attribute. The answer is refused (a failure) before
  any scorer sees it. `evaluating_scorers()` finds the generators whose scorer contains such a
  call, and a test holds that each has a form (a new reasoning-gym version is caught there).
  Every scorer also runs in a grading child process (`posttrain.verifiers.worker`), so an answer
  that takes for ever (`x**9**9**9`) or kills the scorer is a failure and never stalls the run.
* **Partial credit that reaches full credit.** coin_flip gives `matched prefix / shorter
  length`: the constant `0` is a prefix of `0.0625` and scored 1.0 on every task;
  number_sorting accepts every number off by up to 1; pool_matrix accepts 1% relative error
  although the prompt asks for 2 decimals; countdown accepts a value within 1e-5 relative
  (`np.isclose`) and puzzle24 `int(value) == 24` (24.5 passes), and neither requires exactly
  the given numbers without tricks (`len('xxxx')` is a number without digits). `EXTRA_CHECKS`
  decide these exactly, on a full-credit score only.
* **Text the scorer reads as something else.** gsm_symbolic takes the first number anywhere in
  the text (`_plain_number`); `nan`/`inf` in any spelling Python's float/complex accept
  (`nanj`, `1e999`) turn distance-based scores into full credit (`non_finite`).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable
from fractions import Fraction

# -- answer forms --------------------------------------------------------------------------

_TOKEN = re.compile(r"\d+(?:\.\d+)?|[A-Za-z_]\w*|\*\*|[-+*/()]|\s+|.", re.DOTALL)

INTEGRATION_NAMES = frozenset({"C", "sin", "cos", "tan", "sec", "csc", "cot", "asin", "acos", "atan",
                               "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln",
                               "sqrt", "Abs", "pi", "E"})
"""names an integration answer may use besides its variable: sympy's elementary functions (those
the generators' antiderivatives are written with, measured on their oracle answers, and their
usual relatives: `ln`, `Abs`), pi, e and the integration constant. Each is a plain sympy
object: none can import, call Python or reach an attribute. Not `Integral`/`integrate`/`diff`:
restating the question is no answer (the scorer only differentiates the answer)."""


def _expression_in(answer: str, entry: dict) -> str | None:
    """An expression in the item's variable: numbers, + - * / ** ( ), and `INTEGRATION_NAMES`."""
    variable = entry["metadata"]["variable"]
    for tok in _TOKEN.findall(answer):
        if tok.isspace() or tok[0].isdigit() or tok in ("**", "+", "-", "*", "/", "(", ")"):
            continue
        if tok == variable or tok in INTEGRATION_NAMES:
            continue
        return f"{tok!r} is not a number, an operator, {variable!r} or one of {sorted(INTEGRATION_NAMES)}"
    return None


def _arithmetic(answer: str) -> ast.expr:
    """The answer as an expression of non-negative integers, + - * / and parentheses (raises
    ValueError otherwise)."""
    try:
        tree = ast.parse(answer.strip(), mode="eval").body
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"not an arithmetic expression ({type(e).__name__})") from e
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            continue
        if isinstance(node, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            continue
        raise ValueError(f"{type(node).__name__} is not a number or one of + - * / ( )")
    return tree


def _arithmetic_form(answer: str, entry: dict) -> str | None:
    try:
        _arithmetic(answer)
    except ValueError as e:
        return str(e)
    return None


def _chars(allowed: str, what: str) -> Callable[[str, dict], str | None]:
    pattern = re.compile(f"[{allowed}]+")

    def form(answer: str, entry: dict) -> str | None:
        return None if pattern.fullmatch(answer) else f"only {what} may appear"

    return form


FORMS: dict[str, Callable[[str, dict], str | None]] = {
    "simple_integration": _expression_in,
    "intermediate_integration": _expression_in,
    "countdown": _arithmetic_form,
    "puzzle24": _arithmetic_form,
    "binary_matrix": _chars(r"0-9\s", "digits and white space"),
    "spiral_matrix": _chars(r"0-9\s-", "integers and white space"),
    "string_insertion": _chars("A-Za-z", "letters"),
    "n_queens": _chars(r"_Q\s", "'_', 'Q' and white space"),
    "number_sorting": _chars(r"\[\]0-9.,\s'\"-", "a list of quoted numbers"),
}
"""generator -> (answer, entry) -> None where the answer has the form its scorer evaluates
safely, else why not. The honest answers of each (their oracle answers) have it."""

_EVALUATES = re.compile(r"\b(?:eval|exec|parse_expr|sympify|parse_latex|simplify)\(|\bS\(")


def evaluating_scorers(dataset_classes: dict[str, type]) -> list[str]:
    """The generators whose `score_answer` (or a method of theirs it calls, two levels down)
    contains a call that may evaluate text as code."""
    found = []
    for name, cls in dataset_classes.items():
        seen: set[str] = set()
        todo, sources = ["score_answer"], []
        for _ in range(3):
            nxt = []
            for method in todo:
                fn = getattr(cls, method, None)
                if method in seen or fn is None:
                    continue
                seen.add(method)
                try:
                    src = inspect.getsource(fn)
                except (OSError, TypeError):
                    continue
                sources.append(src)
                nxt += re.findall(r"self\.(\w+)\(", src)
            todo = nxt
        if any(_EVALUATES.search(s) for s in sources):
            found.append(name)
    return sorted(found)


# -- non-finite numbers --------------------------------------------------------------------

_NON_FINITE = re.compile(r"(?<![A-Za-z])[-+]?(nan|inf|infinity)(?![a-hk-z]|[ij][a-z])", re.I)  # nanj, infi too
_EXPONENT = re.compile(r"\d[eE]\+?(\d+)")


def non_finite(text: str) -> bool:
    """Whether `text` has a number that Python reads as nan or infinity (nan, -inf, nanj, 1e999)."""
    return (_NON_FINITE.search(text) is not None
            or any(int(e) > 308 for e in _EXPONENT.findall(text)))


# -- extra checks on a full-credit score ---------------------------------------------------

def _exactly(target: Callable[[dict], int]) -> Callable[[str, dict], bool]:
    def check(answer: str, entry: dict) -> bool:
        tree = _arithmetic(answer)
        numbers = sorted(int(n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant))  # type: ignore[arg-type]
        if numbers != sorted(entry["metadata"]["numbers"]):
            return False
        try:
            return _value(tree) == target(entry)
        except ZeroDivisionError:
            return False

    return check


def _value(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(int(node.value))  # type: ignore[arg-type]  # `_arithmetic` admits ints only
    assert isinstance(node, ast.BinOp)
    a, b = _value(node.left), _value(node.right)
    if isinstance(node.op, ast.Add):
        return a + b
    if isinstance(node.op, ast.Sub):
        return a - b
    if isinstance(node.op, ast.Mult):
        return a * b
    return a / b


_puzzle24 = _exactly(lambda entry: 24)
_puzzle24.__doc__ = "the expression uses exactly the four given numbers and makes exactly 24"
_countdown = _exactly(lambda entry: int(entry["metadata"]["target"]))
_countdown.__doc__ = "the expression uses exactly the given numbers and makes exactly the target"


def _plain_number(answer: str, entry: dict) -> bool:
    """the answer is one number: gsm_symbolic's scorer takes the first number anywhere in the
    text, so echoing the question or listing candidates passes whenever the right one comes
    first"""
    return re.fullmatch(r"-?\d+(?:\.\d+)?", answer.strip()) is not None


def _probability(answer: str, entry: dict) -> bool:
    """the probability is within 1e-4 of the right one: coin_flip's partial credit (matched
    prefix / the shorter length) gives the constant `0` full credit against 0.0625"""
    try:
        given = Fraction(answer.replace(",", "").strip())
        right = Fraction(str(entry["answer"]).replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return False
    return abs(given - right) <= Fraction(1, 10_000)


def _same_numbers(answer: str, entry: dict) -> bool:
    """every number equals the right one: number_sorting's scorer accepts each off by up to 1"""
    try:
        given = [float(x) for x in json.loads(answer.replace("'", '"'))]
        right = [float(x) for x in json.loads(str(entry["answer"]).replace("'", '"'))]
    except (ValueError, TypeError):
        return False
    return given == right


def _two_decimals(answer: str, entry: dict) -> bool:
    """every cell is within half a hundredth of the right one: pool_matrix's scorer accepts 1%
    relative error, although the answer is asked to 2 decimals"""
    try:
        given = [[float(x) for x in row.split()] for row in answer.strip().splitlines()]
        right = [[float(x) for x in row.split()] for row in str(entry["answer"]).strip().splitlines()]
    except ValueError:
        return False
    return ([len(r) for r in given] == [len(r) for r in right]
            and all(abs(g - r) <= 0.005 + 1e-9 for gr, rr in zip(given, right) for g, r in zip(gr, rr)))


EXTRA_CHECKS: dict[str, Callable[[str, dict], bool]] = {
    "puzzle24": _puzzle24, "countdown": _countdown, "gsm_symbolic": _plain_number,
    "coin_flip": _probability, "number_sorting": _same_numbers, "pool_matrix": _two_decimals,
}
"""generator -> (answer, entry) -> whether an answer its scorer gave full credit is right"""
