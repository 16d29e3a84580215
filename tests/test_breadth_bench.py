"""benchmarks/breadth.py's (and breadth_evals.py's) own arithmetic: the null delta of sampling
noise, resuming a run with the flags it started with, the focus and confirmation evaluations."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("breadth")


@pytest.fixture(scope="module")
def figures(load_benchmark):
    return load_benchmark("breadth_evals")


def record(domain: str, outcomes: list[bool | None]):
    samples = {j: SimpleNamespace(scored=p is not None, passed=p) for j, p in enumerate(outcomes)}
    return SimpleNamespace(domain=domain, by_index=lambda: samples)


def test_null_delta_is_odd_minus_even_samples_per_task_scaled_to_the_whole_evaluation(figures):
    before = SimpleNamespace(records=[
        # odd samples all pass, even ones all fail: +1 on this task
        record("a", [False, True, False, True]),
        # the same on both sides: 0
        record("a", [True, True, False, False]),
        # an unscored (infrastructure) sample is left out of its side: odd 1/1, even 1/2
        record("b", [True, None, False, True]),
        # not asked for
        record("c", [False, True]),
    ])
    null = figures.null_deltas(before, ["a", "b"])
    assert set(null) == {"a", "b"}
    assert null["a"] == pytest.approx(0.5 / 2 ** 0.5)
    assert null["b"] == pytest.approx(0.5 / 2 ** 0.5)


def test_a_resume_must_repeat_the_flags_it_started_with(bench, tmp_path):
    path = tmp_path / "run" / "bench-segments.json"
    flags = {"steps": 40, "samples": 8, "resume": False}
    fresh = bench._load_segments(path, flags)
    assert fresh == {"flags": {"steps": 40, "samples": 8}, "segments": []}
    with bench._Segment(path, fresh):
        pass
    with bench._Segment(path, bench._load_segments(path, {**flags, "resume": True})):
        pass
    stored = json.loads(path.read_text())
    assert len(stored["segments"]) == 2 and all(s["wall_s"] >= 0 for s in stored["segments"])
    with pytest.raises(SystemExit, match="samples"):
        bench._load_segments(path, {**flags, "samples": 4, "resume": True})
    # fewer steps, or more steps together with another flag: refused
    with pytest.raises(SystemExit, match="steps"):
        bench._load_segments(path, {**flags, "steps": 20, "resume": True})
    with pytest.raises(SystemExit, match="samples"):
        bench._load_segments(path, {**flags, "steps": 80, "samples": 4, "resume": True})
    # more steps alone: the run is trained further, and says from where
    longer = bench._load_segments(path, {**flags, "steps": 80, "resume": True})
    assert longer["flags"]["steps"] == 80 and longer["extended_from"] == [40]
    with bench._Segment(path, longer):
        pass
    again = bench._load_segments(path, {**flags, "steps": 80, "resume": True})
    assert again["extended_from"] == [40] and len(again["segments"]) == 3


def test_each_step_is_measured_against_the_quotas_the_adaptive_scheduler_held(bench):
    from posttrain.scheduling.config import AdaptiveConfig

    def traj(group: str, domain: str, step: int, reward: float, at: float):
        return SimpleNamespace(status="ok", group_id=group, domain=domain, policy_version=f"run/step-{step}",
                               reward=reward, verdict=None, created_at=at)

    rows = [traj("g1", "a", 0, 1.0, 1), traj("g1", "a", 0, 0.0, 2),     # a: a reward spread
            traj("g2", "b", 0, 0.0, 3), traj("g2", "b", 0, 0.0, 4),     # b: none
            traj("g3", "a", 1, 1.0, 5), traj("g3", "a", 1, 0.0, 6),
            traj("g4", "a", 1, 0.0, 7), traj("g4", "a", 1, 1.0, 8),
            traj("g5", "b", 1, 0.0, 9), traj("g5", "b", 1, 0.0, 9)]
    store = SimpleNamespace(trajectories=lambda run_id, split: rows)
    mix = bench.step_mix(store, "run", {"a": 1.0, "b": 1.0}, AdaptiveConfig(window=4, min_groups=1, floor=0.1))
    assert mix["per_step"] == [{"a": 1, "b": 1}, {"a": 2, "b": 1}]
    assert mix["signal"] == {"a": 3}  # the groups with a reward spread, per domain
    assert mix["configured"] == [{"a": 0.5, "b": 0.5}] * 2
    # step 0 begins with the configured weights; step 1 with b at the floor after its flat group
    assert mix["effective"][0] == {"a": 0.5, "b": 0.5}
    assert mix["effective"][1] == pytest.approx({"a": 1 / 1.1, "b": 0.1 / 1.1})
    assert bench.mix_error(mix["per_step"], mix["configured"]) == pytest.approx((1 / 6 + 1 / 6) / 2)
    assert bench.mix_error(mix["per_step"], mix["effective"]) == pytest.approx(
        (abs(2 / 3 - 1 / 1.1) + abs(1 / 3 - 0.1 / 1.1)) / 2)
    # above the floor: a and b at step 0 (all 3 groups, all the quota), a alone at step 1
    assert mix["above_floor"] == [{"a", "b"}, {"a"}]
    assert bench.above_floor(mix["per_step"], mix["effective"], mix["above_floor"]) == pytest.approx(
        ((1 + 2 / 3) / 2, (1 + 1 / 1.1) / 2))
    off = bench.step_mix(store, "run", {"a": 1.0, "b": 1.0}, AdaptiveConfig(enabled=False))
    assert off["effective"] == off["configured"]
    # seeded from the base evaluation (`prior_groups`): step 0 already holds b at the floor
    seeded = bench.step_mix(store, "run", {"a": 1.0, "b": 1.0},
                            AdaptiveConfig(window=4, min_groups=1, floor=0.1, prior_groups=2), {"a": 0.5, "b": 0.0})
    assert seeded["effective"][0] == pytest.approx({"a": 0.5 / 0.6, "b": 0.1 / 0.6})


def _finished_run(tmp_path: Path, name: str):
    """The smoke run (2 trained domains, 4 eval tasks x 2 samples), trained 2 steps: its Job."""
    import os

    from rich.console import Console

    from posttrain.pipeline.config import load_config
    from posttrain.pipeline.main import Job
    from tests.test_pipeline import SMOKE

    path = tmp_path / f"{name}.toml"
    path.write_text(SMOKE.format(name=name, runs=tmp_path / "runs", steps=2))
    job = Job(load_config(path), Console(file=open(os.devnull, "w")))
    job.run()
    return job


@pytest.mark.slow
def test_focus_evaluations_measure_the_finished_run_on_more_tasks_once(figures, tmp_path):
    from posttrain.storage.store import Store

    job = _finished_run(tmp_path, "focus")
    wanted = ["math.add.d2", "text.reverse.l3"]
    before, after, leaked = figures.focus_evals(job, wanted, 6)
    assert leaked == 0
    # 6 tasks a domain (the run evaluated 4), of the learnable domains only, by the base and the
    # trained weights
    for result in (before, after):
        assert sorted({r.domain for r in result.records}) == wanted
        assert len(result.records) == 2 * 6
    assert after.policy.endswith("step-2") and before.policy != after.policy
    run_dir = job.config.run_dir
    assert (run_dir / "evals" / "focus-before.json").exists() and (run_dir / "evals" / "focus-after.json").exists()
    with Store.for_run_dir(run_dir, readonly=True) as store:
        stored = store.counts("eval:focus-after")["episodes"]
    assert stored == 2 * 6 * 2
    # a second call loads what was written: nothing is generated again
    again = figures.focus_figures(job, wanted, 6)
    with Store.for_run_dir(run_dir, readonly=True) as store:
        assert store.counts("eval:focus-after")["episodes"] == stored
        assert sum(store.duplicates().values()) == 0
    assert again["focus_tasks"] == 6 and again["focus_leaked_tasks"] == 0
    assert again["focus_worst_delta"] <= again["focus_mean_delta"]
    assert again["focus_worst_domain"] in wanted
    # the answer shift of the same evaluations, from the stored episodes (2 samples x 6 tasks)
    assert again["focus_max_answer_rise_domain"] in wanted and set(again["focus_answer_rises"]) == set(wanted)
    assert -1.0 <= again["focus_max_answer_rise"] <= 1.0


@pytest.mark.slow
def test_the_worst_domains_are_confirmed_on_fresh_tasks_once(figures, tmp_path):
    from posttrain.evaluation.result import EvalResult
    from posttrain.pipeline.checks import eval_tasks
    from posttrain.storage.store import Store

    job = _finished_run(tmp_path, "confirm")
    # the lowest of the earlier deltas is chosen (ties by name), whatever the order given
    stage = {"text.reverse.l3": 0.1, "math.add.d2": -0.2}
    out = figures.confirm_figures(job, stage, 1, 5, 4)
    assert set(out["confirm_domains"]) == {"math.add.d2"}
    assert out["confirm_domains"]["math.add.d2"]["stage_delta"] == -0.2
    run_dir = job.config.run_dir
    before = EvalResult.load(run_dir / "evals" / "confirm-1x5-before.json")
    after = EvalResult.load(run_dir / "evals" / "confirm-1x5-after.json")
    assert after.policy.endswith("step-2") and before.policy != after.policy
    # fresh tasks: eval seeds 4..8, none of them one of the first 4 the earlier evaluations had
    domains = [d for d in job.train_domains if d.name in out["confirm_domains"]]
    earlier = {t.hash for _, t in eval_tasks(domains, 4)}
    assert {r.hash for r in before.records} == {t.hash for _, t in eval_tasks(domains, 5, start=4)}
    assert not earlier & {r.hash for r in before.records}
    assert {r.seed for r in before.records} == {4, 5, 6, 7, 8}
    for v in out["confirm_domains"].values():
        assert v["tasks"] == 5 and v["ci"][0] <= v["delta"] <= v["ci"][1]
        assert v["a_only"] + v["b_only"] <= 5 * 2  # discordant pairs of 5 tasks x 2 samples
    assert out["confirm_worst_delta"] == min(v["delta"] for v in out["confirm_domains"].values())
    assert out["confirm_worst_domain"] in out["confirm_domains"]
    # every domain at its largest reading: the confirmed one's fresh delta, the other's stage delta
    confirmed = out["confirm_domains"]["math.add.d2"]["delta"]
    assert out["settled_worst_delta"] == min(confirmed, 0.1)
    assert out["settled_worst_domain"] == ("math.add.d2" if confirmed <= 0.1 else "text.reverse.l3")
    # a domain the confirmation did not choose still counts, at its stage reading
    low = figures.confirm_figures(job, {**stage, "text.reverse.l3": -1.0}, 1, 5, 4)
    assert set(low["confirm_domains"]) == {"text.reverse.l3"}
    assert low["settled_worst_delta"] == min(-0.2, low["confirm_domains"]["text.reverse.l3"]["delta"])
    with Store.for_run_dir(run_dir, readonly=True) as store:
        stored = store.counts("eval:confirm-1x5-after")["episodes"]
    assert stored == 5 * 2
    # measured again: loaded, nothing generated twice
    assert figures.confirm_figures(job, stage, 1, 5, 4)["confirm_domains"] == out["confirm_domains"]
    with Store.for_run_dir(run_dir, readonly=True) as store:
        assert store.counts("eval:confirm-1x5-after")["episodes"] == stored
        assert sum(store.duplicates().values()) == 0
    assert figures.confirm_figures(job, stage, 0, 5, 4) == {}


def _beside_pids(runs: Path) -> list[int]:
    """The processes running `breadth.py --focus-beside` for `runs` (from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--focus-beside" in cmd and str(runs).encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_focus_evaluations_run_beside_the_run_and_die_with_it(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.test_pipeline import SMOKE

    config = tmp_path / "fb.toml"  # two domains the shipped model passes at times: both learnable
    config.write_text(SMOKE.format(name="fb", runs=tmp_path, steps=2)
                      .replace('["math.add.d2", "text.reverse.l3"]', '["text.upper.l3", "math.max.d1"]')
                      .replace('["math.add.d1"]', '["math.max.d2"]'))
    runs = tmp_path / "runs"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "breadth.py"), "--config", str(config), "--runs-dir", str(runs),
           "--steps", "2", "--tasks-per-domain", "4", "--samples", "8", "--focus-tasks", "6"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # killed: the process beside it goes too (a --resume would otherwise start a second one)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not _beside_pids(runs):
        time.sleep(0.2)
    assert _beside_pids(runs), "the focus process did not start"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and _beside_pids(runs):
        time.sleep(0.2)
    assert not _beside_pids(runs)
    # the whole run: the base and trained weights' focus evaluations are made beside it, and the
    # benchmark's process only loads them
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["focus_beside_exit"] == 0 and out["learnable_domains"] == 2 and out["focus_tasks"] == 6
    assert "focus-before: loaded" in done.stdout and "focus-after: loaded" in done.stdout
    side = (runs / "focus-beside.log").read_text()
    assert "focus-before: 12 tasks evaluated" in side and "focus-after: 12 tasks evaluated" in side
    evals = runs / "fb" / "evals"
    after = json.loads((evals / "focus-after.json").read_text())
    assert after["policy"].endswith("fb/step-2")
    # an A/B of another training setting: the starting weights' evaluations are copied, not drawn
    again = subprocess.run([*cmd[:5], str(tmp_path / "runs-b"), *cmd[6:], "--base-from", str(runs),
                            "--set", "trainer.lr=3e-4"], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    out_b = json.loads(again.stdout.strip().splitlines()[-1])
    assert out_b["reused"] == {"before": 3 * 4 * 8, "focus-before": 6 * 2 * 8} and out["reused"] == {}
    for name in ("before", "focus-before"):
        a, b = (json.loads((r / "fb" / "evals" / f"{name}.json").read_text()) for r in (runs, tmp_path / "runs-b"))
        assert a["records"] == b["records"]
    assert "focus-after: nothing reused" in (tmp_path / "runs-b" / "focus-beside.log").read_text()


def test_targets_read_each_figure_against_its_bound_and_say_what_was_not_measured(bench):
    figures = {"domains_trained": 329, "infra_error_rate": 0.0, "step_mix_error": 0.0287,
               "mean_delta": 0.05, "focus_mean_delta": 0.0499, "worst_delta": -0.0625,
               "confirm_worst_delta": -0.02, "settled_worst_delta": -0.021, "heldout_delta": None}
    verdict = bench.targets(figures)
    assert verdict == {
        "domains_trained >= 300": True, "infra_error_rate <= 0.01": True, "step_mix_error <= 0.05": True,
        "mean_delta >= 0.05": True, "focus_mean_delta >= 0.05": False, "worst_delta >= -0.02": False,
        "confirm_worst_delta >= -0.02": True, "settled_worst_delta >= -0.02": False,
        "heldout_delta >= -0.01": None}
    assert bench.targets({**figures, "domains_trained": 299, "infra_error_rate": 0.011})[
        "domains_trained >= 300"] is False
    assert bench.targets({**figures, "infra_error_rate": 0.011})["infra_error_rate <= 0.01"] is False


def test_the_process_beside_a_run_takes_the_cores_the_run_leaves_and_never_none(figures):
    beside = figures.beside_threads
    assert beside(2, cores=2) == 1  # the shipped configs on a 2-core machine: 2 + 1, not 2 + 2
    assert beside(0, cores=2) == 1  # torch's default is every core
    assert beside(1, cores=2) == 1
    assert beside(4, cores=16) == 4  # no more than the run's own
    assert beside(12, cores=16) == 4
    assert beside(8, cores=4) == 1
