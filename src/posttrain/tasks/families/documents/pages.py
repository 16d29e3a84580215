"""Statement pages as images: `docs.page.<kind>` (image domains, `single` env).

The same questions and statements as `docs.finance.<kind>.md`, but the statements are shown as
printed pages (one image per statement: title, unit line and an aligned table in a monospace
font, drawn by `pictures`, byte-identical for the same statement) instead of attached text. The
answer is the same JSON object, graded by the same `json` verifier.

Textual fallback (a text-only policy): the statements as the Markdown documents they were
printed from.
"""

from __future__ import annotations

import json

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import draw_problem
from posttrain.tasks.families.documents.questions import KINDS, Kind
from posttrain.tasks.families.pictures import figure, png
from posttrain.values.image import Image
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.structured import STRUCTURED

LIMITS = TaskLimits(max_turns=1, max_tokens=256, context_tokens=4096)
LINE_PX = 15


def page_lines(markdown: str) -> list[str]:
    """A Markdown statement as the lines of a printed page (the table's columns aligned)."""
    head = [ln.lstrip("# ").strip("()") for ln in markdown.splitlines() if ln and not ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in markdown.splitlines()
            if ln.startswith("|") and not ln.startswith("|---")]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = [r[0].ljust(widths[0]) + "".join("  " + c.rjust(w) for c, w in zip(r[1:], widths[1:])) for r in rows]
    return [*head, "", table[0], "-" * len(table[0]), *table[1:]]


def page_image(markdown: str) -> Image:
    lines = page_lines(markdown)
    height = LINE_PX * (len(lines) + 2)
    with figure(560, height) as fig:
        for i, line in enumerate(lines):
            fig.text(0.02, 1 - (i + 1) * LINE_PX / height, line, family="DejaVu Sans Mono", fontsize=9,
                     weight="bold" if i == 0 else "normal", va="center")
        return png(fig)


def pages(task: Task) -> tuple[Image, ...]:
    return tuple(page_image(text) for _, text in sorted(task.reference["pages"].items()))


def pages_as_text(task: Task) -> str:
    return "The pages as text:\n\n" + "\n\n".join(
        f"--- {path} ---\n{text.rstrip()}" for path, text in sorted(task.reference["pages"].items()))


def _domain(kind: Kind) -> Domain:
    from posttrain.tasks.families.documents import FORMAT_NAMES, _draw, _negatives, verifier_settings

    name = f"docs.page.{kind.name}"

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, lambda rng: _draw(kind, "md", rng, split))
        attached = f"The {FORMAT_NAMES['md']} documents {', '.join(sorted(p.files))} are attached."
        if attached not in p.prompt:
            raise ValueError(f"domain {name}: the problem's prompt no longer names its documents as expected")
        n = len(p.files)
        prompt = p.prompt.replace(attached, f"The statement page{'s are' if n > 1 else ' is'} shown below "
                                            f"({n} image{'s' if n > 1 else ''}).")
        return Task(domain=name, prompt=prompt, env="single", split=split, seed=seed, limits=LIMITS,
                    reference={"answer": p.data["answer"], "decoy": p.data["decoy"], "pages": dict(p.files)},
                    verifier=verifier_settings(p), tags=("docs", "finance", "vision"))

    return Domain(name=name, family="docs", env="single", verifier=STRUCTURED, generate=generate,
                  oracle=lambda task: [json.dumps(task.reference["answer"])], negatives=_negatives,
                  description=f"{kind.name} from statement pages shown as images",
                  tags=("docs", "finance", "vision"), stop=(), images=pages, text_fallback=pages_as_text)


def domains() -> list[Domain]:
    return [_domain(kind) for kind in KINDS]
