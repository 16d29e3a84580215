"""Run-time task sources outlive the process that read them: a run records them (paths made
absolute), `posttrain replay` in a new process, from another directory, reads them again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.tasks.sources import absolute, recorded_sources

ROOT = Path(__file__).resolve().parents[1]


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_sources_are_recorded_with_absolute_paths(tmp_path):
    assert absolute("data:qa.jsonl?answer=sol&verifier=numeric", tmp_path) == \
        f"data:{tmp_path.resolve()}/qa.jsonl?answer=sol&verifier=numeric"
    assert absolute("harbor:tasks/one", tmp_path) == f"harbor:{tmp_path.resolve()}/tasks/one"
    assert absolute("verifiers:my-env?n=3", tmp_path) == "verifiers:my-env?n=3"
    configs = [{"kind": "rollout", "sources": ["data:/a.jsonl"]}, {"kind": "eval", "sources": []},
               {"name": "train", "domains": {"sources": ["data:/b.jsonl", "data:/a.jsonl"]}}]
    assert recorded_sources(configs) == ["data:/a.jsonl", "data:/b.jsonl"]


@pytest.mark.slow
def test_replay_of_a_data_source_run_in_a_new_process_from_elsewhere(tmp_path):
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir()
    elsewhere.mkdir()
    (made / "qa.jsonl").write_text("".join(json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                                           for i in range(30)))
    p = _cli(["rollout", "--source", "data:qa.jsonl", "--domains", "data.qa", "--n", "3",
              "--run-dir", "run", "--json"], made)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["episodes"] == 3

    p = _cli(["replay", str(made / "run"), "--all", "--json"], elsewhere)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["replayed"], out["matched"], out["diverged"]) == (3, 3, [])

    (made / "qa.jsonl").unlink()  # the data is gone: replay says which source, and why
    p = _cli(["replay", str(made / "run"), "--all"], elsewhere)
    assert p.returncode == 2 and "cannot be read again" in p.stderr and "qa.jsonl" in p.stderr
    assert "Traceback" not in p.stderr


VF_ENV = """
import verifiers as vf
from datasets import Dataset

def load_environment(**kwargs):
    def correct(completion, answer):
        return float(completion[-1]["content"].strip() == answer)

    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": f"{i}*3=", "answer": str(3 * i)}
                                                       for i in range(12)]),
                            rubric=vf.Rubric(funcs=[correct]))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # Ray's start-up alone took minutes on a loaded 2-core machine
def test_ray_actors_run_and_grade_episodes_of_run_time_sources(tmp_path, monkeypatch):
    """The training job hands the Ray backend its domains by name -> Domain; the actors (other
    processes) get them pickled: a data domain with its rows, a verifiers domain as its name and
    arguments, loaded again in the actor (`EnvRef`)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = pytest.importorskip("ray", reason="Ray is in the test extra")
    import asyncio

    from posttrain.scheduling.episodes import RolloutEpisodeFactory
    from posttrain.scheduling.ray_backend import RayBackend
    from posttrain.scheduling.work import EpisodeSpec
    from posttrain.tasks import registry
    from posttrain.tasks.sources import _loaded, use_sources
    from posttrain.values.generation import Completion

    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                                               for i in range(20)))
    specs = [f"data:{tmp_path / 'qa.jsonl'}"]
    try:
        import verifiers  # noqa: F401

        (tmp_path / "ptvf_times.py").write_text(VF_ENV)
        monkeypatch.syspath_prepend(str(tmp_path))
        specs.append("verifiers:ptvf_times")
    except ImportError:
        pass
    monkeypatch.setattr(registry, "BUILTIN_FAMILY_MODULES", ("posttrain.tasks.families.text",))
    registry.reset_cache()
    _loaded.clear()
    domains = {d.name: d for d in use_sources(specs)}
    # the actors import the environment package as an installed one would be: from their path
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)])}})

    async def play(backend, domain, answer):
        task = domain.task(1, "train")
        spec = EpisodeSpec(group_id=f"{domain.name}#0", domain=domain.name, tier="train", split="train",
                           member=0, attempt=0, task_seed=1, sampling_seed=0, policy_version="v0",
                           version=0, task=task)
        handle, (request, _, _) = await backend.start(spec)
        assert request is not None
        _, result, _ = await backend.advance(handle, Completion(text=answer, finish_reason="stop"))
        return result.trajectory

    async def main():
        backend = RayBackend(RolloutEpisodeFactory(domains), num_workers=1, concurrency=2)
        backend.open()
        try:
            out = {}
            for name, d in domains.items():
                right = d.oracle(d.task(1, "train"))[0]
                out[name] = [await play(backend, d, right), await play(backend, d, "nonsense")]
            return out
        finally:
            await backend.close()

    try:
        results = asyncio.run(main())
    finally:
        ray.shutdown()
        registry.reset_cache()
        _loaded.clear()
        sys.modules.pop("ptvf_times", None)
    assert set(results) == {"data.qa"} | ({"verifiers.ptvf_times"} if len(specs) == 2 else set())
    for name, (right, wrong) in results.items():
        assert right.status == "completed" and right.reward == 1.0, (name, right.error)
        assert wrong.status == "completed" and wrong.reward == 0.0, (name, wrong.error)
