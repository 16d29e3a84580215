"""When an evaluation's figures cannot be trusted, and why: the rule behind exit code 3.

Infrastructure errors (a policy server that is down, a sandbox that died, a verifier that
crashed) are excluded from scores, never counted as failures. That keeps scores honest only
while they are rare: with most episodes missing, a pass@1 is the pass@1 of whatever survived.
So a result is **untrustworthy** when

* any domain has infrastructure errors on 100% of its episodes (it has no score at all), or
* the overall infrastructure-error rate is above `DEFAULT_MAX_INFRA_RATE` (5%;
  `--max-infra-rate` changes it, 1 turns this rule off).

`posttrain eval` and `posttrain run` print the reasons and exit 3 (`EXIT_UNTRUSTWORTHY`); the
results are still written (they say what failed), the exit code says not to use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_MAX_INFRA_RATE = 0.05
"""the overall infrastructure-error share above which an evaluation is not trusted"""


def untrustworthy(summary: Mapping[str, Any], max_infra_rate: float = DEFAULT_MAX_INFRA_RATE,
                  label: str = "") -> list[str]:
    """Reasons not to trust an evaluation summary (`EvalResult.summary`); [] when it is fine."""
    if not 0 <= max_infra_rate <= 1:
        raise ValueError(f"max_infra_rate must be in [0, 1], got {max_infra_rate!r}")
    prefix = f"{label}: " if label else ""
    reasons = []
    dead = sorted(d for d, v in summary.get("domains", {}).items() if v.get("infra_error_rate") == 1)
    if dead:
        shown = ", ".join(dead[:5]) + (f" and {len(dead) - 5} more" if len(dead) > 5 else "")
        reasons.append(f"{prefix}{len(dead)} domain(s) had infrastructure errors on every episode "
                       f"(no score): {shown}")
    rate = summary.get("infra_error_rate")
    if rate is not None and rate > max_infra_rate:
        reasons.append(f"{prefix}{100 * rate:.1f}% of {summary.get('episodes', '?')} episodes were "
                       f"infrastructure errors (threshold {100 * max_infra_rate:g}%, --max-infra-rate)")
    return reasons
