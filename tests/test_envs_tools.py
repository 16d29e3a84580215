"""The tool-use environment end to end, in real sandboxes."""

import pytest

from posttrain.envs import EnvConfig, make_env, play_actions
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.sandbox import SandboxPool
from posttrain.scheduling.engine import run_episodes
from posttrain.values.generation import Completion, PolicyVersion, SamplingParams
from posttrain.values.task import TaskLimits
from tests.toydomains import file_domain

D = file_domain()
LOOKUP = {D.name: D}.__getitem__


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(size=2) as p:
        yield p


def test_oracle_passes_negatives_fail(pool):
    task = D.task(1)
    assert play_actions(D, task, D.oracle(task)).passed
    for name, actions in D.negatives(task).items():
        assert not play_actions(D, task, actions).passed, name


def test_tool_errors_are_observations_and_counted(pool):
    d = file_domain("toy.file5", max_turns=5)
    env = make_env(d, EnvConfig(observation_max_chars=200), pool.sandbox)
    obs = env.reset(d.task(2))
    assert "word.txt" in obs.text and "<submit>" in obs.text
    r = env.step('<read path="missing.txt"/><bash>exit 3</bash><frobnicate>x</frobnicate>')
    assert not r.terminated and not r.truncated
    assert "missing.txt" in r.observation.text and "exit 3" in r.observation.text
    r = env.step('{"name": "rm_rf", "arguments": {}}')
    assert "unknown tool" in r.observation.text
    r = env.step("I am thinking about it")
    assert "no tool call found" in r.observation.text
    r = env.step('<read path="../../etc/passwd"/><bash>seq 1 2000</bash>')
    assert "error" in r.observation.text and "characters cut" in r.observation.text
    assert not r.truncated
    r = env.step("<bash>true</bash>")  # the 5th and last turn
    assert r.truncated and r.verdict is not None and not r.verdict.passed
    assert env.counters["tool_errors"] >= 3 and env.counters["parse_errors"] >= 1
    assert env.counters["command_failures"] >= 1 and env.counters["observation_truncations"] == 1
    env.close()


def test_edit_tool_and_multi_call_turn(pool):
    task = D.task(3)
    word = task.files["word.txt"].strip()
    actions = [f'<write path="out.txt">{word}</write>'
               f'<edit path="out.txt"><old>{word}</old><new>{word[::-1]}</new></edit><submit></submit>']
    assert play_actions(D, task, actions).passed


def test_runner_records_turns_snapshots_and_workspace(pool, tmp_path):
    from posttrain.storage.store import Store

    specs = [(D, D.task(i)) for i in range(3)]
    store = Store.for_run_dir(tmp_path)
    saved = []

    def save(result):
        store.put_trajectory(result.trajectory, result.task, result.workspace_archive)
        saved.append(result.trajectory.id)

    trajs = run_episodes(specs, ScriptedPolicy.oracle(), sandbox_factory=pool.sandbox,
                         on_result=save, run_id="t")
    assert len(saved) == 3
    for t in trajs:
        assert t.status == "completed" and t.passed and len(t.turns) == 3
        assert t.turns[0].tool_calls[0]["name"] == "bash" and t.turns[0].snapshot_id
        assert t.final_workspace_sha256 and t.sandbox["backend"] == "bwrap"
        assert "out.txt" in store.get_blob(t.final_workspace_sha256).decode("latin-1")


def test_turn_budget_truncates_and_still_grades(pool):
    d = file_domain("toy.file2", max_turns=2)
    policy = ScriptedPolicy.playing(["<bash>rev word.txt > out.txt</bash>", "<bash>true</bash>",
                                     "<submit></submit>"], "s")
    (t,) = run_episodes([(d, d.task(0))], policy, sandbox_factory=pool.sandbox)
    assert t.status == "truncated" and t.passed and t.counters["turn_limit"] == 1


class _ContextHog:
    version = PolicyVersion("hog")

    def generate(self, requests):
        return [Completion(text="<bash>seq 1 50</bash>", finish_reason="stop",
                           prompt_token_ids=[0] * 90, token_ids=[1] * 5) for _ in requests]


def test_context_budget_truncates(pool):
    from posttrain.tasks.domain import Domain
    base = file_domain("toy.file3", max_turns=50)

    def gen(seed, split):
        t = base.generate(seed, split)
        return t.model_copy(update={"limits": TaskLimits(max_turns=50, context_tokens=100, max_tokens=8)})

    d = Domain(name="toy.file3", family="toy", env="tools", verifier=base.verifier, generate=gen,
               oracle=base.oracle, negatives=base.negatives)
    (t,) = run_episodes([(d, d.task(0))], _ContextHog(), SamplingParams(max_tokens=8),
                        sandbox_factory=pool.sandbox)
    assert t.status == "truncated" and t.counters["context_budget_exhausted"] == 1
    assert len(t.turns) < 5


class _OutgrowsTheModel:
    """Acts once, then its prompt no longer fits the model's context (as TorchPolicy and
    OpenAI-compatible servers report it)."""
    version = PolicyVersion("small-context")

    def __init__(self, first_turn_fits: bool = True):
        self.calls = 0
        self.first_turn_fits = first_turn_fits

    def generate(self, requests):
        self.calls += 1
        if self.calls == 1 and self.first_turn_fits:
            return [Completion(text="<bash>rev word.txt > out.txt</bash>", finish_reason="stop") for _ in requests]
        return [Completion(text="", finish_reason="error", context_exceeded=True,
                           error="prompt of 900 tokens does not fit the model's maximum context length of 128 tokens")
                for _ in requests]


def test_outgrowing_the_model_context_truncates_but_a_first_prompt_too_long_is_infra(pool):
    (t,) = run_episodes([(D, D.task(7))], _OutgrowsTheModel(), sandbox_factory=pool.sandbox)
    assert t.status == "truncated" and t.counters["context_budget_exhausted"] == 1
    assert len(t.turns) == 1 and t.verdict is not None and t.passed  # still graded: the work was done
    (t,) = run_episodes([(D, D.task(7))], _OutgrowsTheModel(first_turn_fits=False), sandbox_factory=pool.sandbox)
    assert t.status == "infra_error" and t.error.where == "context" and "context length" in t.error.message


def test_sandbox_killed_mid_episode_is_infra_error(pool):
    class Killer:
        version = PolicyVersion("killer")

        def __init__(self):
            self.n = 0

        def generate(self, requests):
            self.n += 1
            return [Completion(text="<bash>ls</bash>", finish_reason="stop") for _ in requests]

    from posttrain.rollout.episode import Episode
    ep = Episode(D, D.task(5), policy_version="k", sandbox_factory=pool.sandbox)
    req = ep.start()
    req = ep.advance(Killer().generate([req])[0])
    ep._env.sandbox.close()  # the sandbox dies under the episode
    assert ep.advance(Killer().generate([req])[0]) is None
    t = ep.result().trajectory
    assert t.status == "infra_error" and t.error.where == "sandbox" and t.reward is None
