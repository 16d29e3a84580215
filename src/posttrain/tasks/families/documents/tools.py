"""Tool-use variants of the cross-document questions: `docs.lookup.<kind>.<format>`.

The documents are placed in the episode's workspace instead of the prompt; the policy finds
figures with the `lookup` tool (or bash, read), then answers with `<submit>{...json...}</submit>`.
Grading is the same `json` verifier as the single-answer domains.

The content split of a lookup task is that of the single-answer problem it is built from (the
same question and documents), so a problem never sits in train in one variant and in eval in
the other.
"""

from __future__ import annotations

import json

from posttrain.tasks.domain import Domain, ToolSpec
from posttrain.tasks.families.common import draw_problem
from posttrain.tasks.families.documents.questions import KINDS, Kind
from posttrain.tasks.families.documents.render import FORMATS
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.structured import STRUCTURED

TOOL_KINDS = ("cash-reconciliation", "retained-earnings", "ppe-rollforward", "compare-net-income")
LIMITS = TaskLimits(max_turns=8, max_tokens=256, context_tokens=8192, time_s=120.0)
MAX_HITS = 40
"""lines one lookup returns at most (the rest are counted, not shown)"""


def lookup(sandbox, args: str) -> str:
    """Lines of the workspace documents that contain `args` (case-insensitive), each with its
    file, line number and the file's column header. Reads files through the sandbox API; runs
    no process."""
    term = args.strip()
    if not term:
        raise ValueError('lookup needs a search term, e.g. <tool name="lookup">Net income</tool>')
    hits: list[str] = []
    for path in sandbox.list_files():
        lines = sandbox.read_file(path).decode("utf-8", errors="replace").splitlines()
        header = next((ln.strip() for ln in lines if "line item" in ln.lower()), "")
        found = [f"{path}:{n}: {ln.strip()}" for n, ln in enumerate(lines, 1) if term.lower() in ln.lower()]
        if found:
            hits += ([f"{path}: columns: {header}"] if header else []) + found
    if not hits:
        return f"no line contains {term!r}"
    more = len(hits) - MAX_HITS
    return "\n".join(hits[:MAX_HITS]) + (f"\n[{more} more lines not shown]" if more > 0 else "")


LOOKUP = ToolSpec(name="lookup", description="show the document lines containing ARGS, with their column headers",
                  run=lookup)


def _tools_domain(kind: Kind, fmt: str) -> Domain:
    from posttrain.tasks.families.documents import _draw, _negatives, verifier_settings

    name = f"docs.lookup.{kind.name}.{fmt}"

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, lambda rng: _draw(kind, fmt, rng, split))
        # The single-answer prompt names the attached documents; here they are in the workspace.
        prompt = p.prompt.replace(" are attached.", " are in the workspace; use the tools to read them.")
        prompt += " Submit it with <submit>JSON</submit>."
        return Task(domain=name, prompt=prompt, files=dict(p.files),
                    reference={"answer": p.data["answer"], "decoy": p.data["decoy"]},
                    verifier=verifier_settings(p), env="tools", limits=LIMITS, split=split,
                    tags=("docs", "finance", "tools", fmt), seed=seed)

    def oracle(task: Task) -> list[str]:
        first_field = next(iter(task.reference["answer"]))
        term = {"cash_beginning": "Cash and cash equivalents", "retained_earnings_beginning": "Retained earnings",
                "ppe_beginning": "Property, plant", "net_income": "Net income"}.get(first_field, "Total")
        return [f'<tool name="lookup">{term}</tool>', f"<submit>{json.dumps(task.reference['answer'])}</submit>"]

    def negatives(task: Task) -> dict[str, list[str]]:
        # The schema-level negatives (missing field, numbers as text...) are the single-answer
        # variant's; each one here costs a sandbox episode, so only these few.
        out = {k: [f"<submit>{v[-1]}</submit>"] for k, v in _negatives(task).items()
               if k in ("empty", "wrong", "malformed")}
        out["no_submit"] = ['<tool name="lookup">Net income</tool>']  # runs out of actions: truncated
        return out

    return Domain(name=name, family="docs", env="tools", verifier=STRUCTURED, generate=generate, oracle=oracle,
                  negatives=negatives, description=f"{kind.name} from {fmt} documents in a workspace, with tools",
                  tags=("docs", "finance", "tools", fmt), tools=(LOOKUP,))


def tool_domains() -> list[Domain]:
    by_name = {k.name: k for k in KINDS}
    return [_tools_domain(by_name[k], fmt) for k in TOOL_KINDS for fmt in FORMATS]
