"""`--source verifiers:NAME`: environments of the `verifiers` package (written here, loaded with the
real package's `load_environment`) become domains that pass `tasks check`, grade with their
rubric, and call their tools."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks import registry
from posttrain.tasks.sources import SourceError, _loaded, use_sources
from posttrain.verifiers.base import Outcome

# checked without importing `verifiers` when the module is collected: the environments below
# import it when they are loaded
pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None,
                                reason="the verifiers extra: pip install 'posttrain[verifiers]'")

ENVS = {
    # single-turn, a train and an eval dataset, a weighted rubric whose reward is not 0/1
    "ptvf_add": """
        import verifiers as vf
        from datasets import Dataset

        def rows(lo, hi):
            return Dataset.from_list([{"question": f"{a} + {a + 1} =", "answer": str(2 * a + 1)}
                                      for a in range(lo, hi)])

        def load_environment(start=0, **kwargs):
            def correct(completion, answer, parser):
                return 1.0 if parser.parse_answer(completion).strip() == answer else 0.0

            def short(completion):
                if completion[-1]["content"] == "boom":
                    raise RuntimeError("cannot measure this")
                return 1.0 if len(completion[-1]["content"]) <= 4 else 0.0

            return vf.SingleTurnEnv(dataset=rows(start, start + 20), eval_dataset=rows(100, 110),
                                    system_prompt="Answer with the number.",
                                    rubric=vf.Rubric(funcs=[correct, short], weights=[0.8, 0.2]))
    """,
    # a tool environment with a train dataset only (split by prompt hash) and an async reward
    "ptvf_lookup": """
        import verifiers as vf
        from datasets import Dataset

        CAPITALS = {"France": "Paris", "Peru": "Lima", "Japan": "Tokyo", "Kenya": "Nairobi",
                    "Chile": "Santiago", "Egypt": "Cairo", "Spain": "Madrid", "India": "New Delhi"}

        def capital_of(country: str) -> str:
            \"\"\"The capital city of a country.\"\"\"
            return CAPITALS[country]

        def load_environment(**kwargs):
            async def exact(completion, answer):
                return float(completion[-1]["content"].strip() == answer)

            data = Dataset.from_list([{"question": f"What is the capital of {c}?", "answer": a}
                                      for c, a in CAPITALS.items()])
            return vf.ToolEnv(dataset=data, tools=[capital_of], max_turns=3,
                              rubric=vf.Rubric(funcs=[exact]))
    """,
    "ptvf_group": """
        import verifiers as vf
        from datasets import Dataset

        def load_environment(**kwargs):
            def rank(completions, answers) -> list[float]:
                return [1.0] * len(completions)

            return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                                    rubric=vf.Rubric(funcs=[rank]))
    """,
    "ptvf_multi": """
        import verifiers as vf
        from datasets import Dataset

        class Chat(vf.MultiTurnEnv):
            async def env_response(self, messages, state, **kwargs):
                return [{"role": "user", "content": "again"}]

        def load_environment(**kwargs):
            return Chat(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                        rubric=vf.Rubric(funcs=[lambda completion: 1.0]))
    """,
}


@pytest.fixture(autouse=True)
def envs(tmp_path, monkeypatch):
    for name, source in ENVS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "BUILTIN_FAMILY_MODULES", ("posttrain.tasks.families.text",))
    registry.reset_cache()
    _loaded.clear()
    yield
    registry.reset_cache()
    _loaded.clear()
    for name in ENVS:
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_single_turn_environment_is_a_checked_domain():
    [domain] = use_sources(["verifiers:ptvf_add?start=5"])
    assert domain.name == "verifiers.ptvf_add" and domain.env == "single"
    task = domain.task(0, "train")
    assert task.prompt == "Answer with the number.\n\n5 + 6 =" and task.reference["row"]["answer"] == "11"
    assert domain.task(3, "eval").prompt.endswith("103 + 104 =")  # the environment's own eval set
    report = check_domains([domain], per_domain=6)
    assert report.ok, [f"{f.kind}: {f.detail}" for f in report.failures]

    # the reward is the rubric's weighted sum; it passes at the environment's pass_threshold (0.5)
    full = domain.verifier.verify(task, Outcome("11"))
    assert full.passed and full.score == pytest.approx(1.0)
    assert full.details["functions"] == {"correct": 1.0, "short": 1.0}
    long_right = domain.verifier.verify(task, Outcome("11      "))
    assert long_right.passed and long_right.details["reward"] == pytest.approx(0.8)
    wrong_short = domain.verifier.verify(task, Outcome("12"))
    assert not wrong_short.passed and wrong_short.score == pytest.approx(0.2)


@pytest.mark.slow
def test_tool_environment_calls_its_tools():
    [domain] = use_sources(["verifiers:ptvf_lookup"])
    assert domain.env == "tools" and [t.name for t in domain.tools] == ["capital_of"]
    assert domain.tools[0].description == "The capital city of a country."
    assert domain.tools[0].run(None, '{"country": "Peru"}') == "Lima"
    with pytest.raises(ValueError, match="KeyError"):
        domain.tools[0].run(None, '{"country": "Atlantis"}')
    with pytest.raises(ValueError, match="JSON object"):
        domain.tools[0].run(None, "Peru")
    splits = {domain.task(s, "train").split for s in range(3)}
    assert splits == {"train"}  # a train dataset only: rows split by prompt hash
    task = domain.task(0, "train")
    assert domain.verifier.verify(task, Outcome(task.reference["row"]["answer"])).passed
    report = check_domains([domain], per_domain=3)  # episodes in the tools environment's sandbox
    assert report.ok, [f"{f.kind}: {f.detail}" for f in report.failures]


@pytest.mark.parametrize("name, message", [
    ("ptvf_group", "scores a whole group"), ("ptvf_multi", "Chat is not supported"),
    ("no_such_env_here", "load_environment failed"),
])
def test_unsupported_environments_are_refused_by_name(name, message):
    with pytest.raises(SourceError, match=message):
        use_sources([f"verifiers:{name}"])


def test_a_crashing_reward_function_is_a_failed_verdict_not_a_zero():
    [domain] = use_sources(["verifiers:ptvf_add"])
    got = domain.verifier.verify(domain.task(0, "train"), Outcome("boom"))
    assert got.passed is False and got.details.get("grader_failed") is True
    assert "'short': RuntimeError: cannot measure this" in got.details["reason"]
