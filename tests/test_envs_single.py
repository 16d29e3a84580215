import pytest

from posttrain.envs import EnvConfig, make_env, play_actions
from posttrain.envs.budget import truncate_text
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.values.generation import Completion, PolicyVersion, SamplingParams
from tests.toydomains import CrashingVerifier, add_domain

DOMAINS = {"toy.add": add_domain(), "toy.crash": add_domain("toy.crash", CrashingVerifier())}


def test_single_env_oracle_and_negatives():
    d = DOMAINS["toy.add"]
    task = d.task(3)
    assert play_actions(d, task, d.oracle(task)).passed
    for name, actions in d.negatives(task).items():
        assert not play_actions(d, task, actions).passed, name


def test_single_env_shows_files_inline_and_counts_cuts():
    from posttrain.values.task import Task
    d = DOMAINS["toy.add"]
    env = make_env(d, EnvConfig(show_files_in_prompt_chars=100))
    obs = env.reset(Task(domain="toy.add", prompt="Q", files={"a.txt": "x" * 500}, reference="1"))
    assert obs.text.startswith("Q") and "a.txt" in obs.text and obs.truncated_chars > 0
    assert "characters cut" in obs.text and env.counters["observation_truncations"] == 1


def test_runner_records_verdicts_and_infra_errors():
    tasks = [(DOMAINS["toy.add"], DOMAINS["toy.add"].task(i)) for i in range(4)]
    tasks.append((DOMAINS["toy.crash"], DOMAINS["toy.crash"].task(0)))
    trajs = run_episodes(tasks, ScriptedPolicy.oracle(), SamplingParams())
    assert [t.status for t in trajs] == ["completed"] * 4 + ["infra_error"]
    assert all(t.reward == 1.0 and t.passed for t in trajs[:4])
    crash = trajs[4]
    assert crash.reward is None and crash.error.where == "verifier" and "check script" in crash.error.message
    assert trajs[0].turns[0].action == tasks[0][1].reference
    assert trajs[0].task_hash == tasks[0][1].hash and trajs[0].verifier_version == "toy-exact@1"


class _Broken:
    version = PolicyVersion("broken")

    def generate(self, requests):
        raise ConnectionError("server down")


def test_policy_failure_is_infra_error_not_zero_reward():
    d = DOMAINS["toy.add"]
    trajs = run_episodes([(d, d.task(i)) for i in range(3)], _Broken())
    assert all(t.status == "infra_error" and t.reward is None and t.error.where == "policy" for t in trajs)
    assert "server down" in trajs[0].error.message


class _Long:
    version = PolicyVersion("long")

    def generate(self, requests):
        return [Completion(text="1" * r.sampling.max_tokens, finish_reason="length",
                           prompt_token_ids=[0] * 5, token_ids=[1] * r.sampling.max_tokens)
                for r in requests]


def test_length_cut_is_counted():
    d = DOMAINS["toy.add"]
    (t,) = run_episodes([(d, d.task(1))], _Long(), SamplingParams(max_tokens=8))
    assert t.status == "completed" and t.counters["length_cut"] == 1 and not t.passed
    assert t.sampling["max_tokens"] == 8 and "\n" in t.sampling["stop"]


@pytest.mark.parametrize("mode", ["head", "tail", "middle"])
def test_truncate_text_marks_cut(mode):
    text = "".join(chr(97 + i % 26) for i in range(1000))
    out, cut = truncate_text(text, 100, mode)
    assert cut == 900 and "[... 900 characters cut ...]" in out
    assert len(out) < 100 + 40
    if mode == "head":
        assert out.startswith(text[:100])
    if mode == "tail":
        assert out.endswith(text[-100:])
    if mode == "middle":
        assert out.startswith(text[:50]) and out.endswith(text[-50:])
    assert truncate_text("short", 100, mode) == ("short", 0)
