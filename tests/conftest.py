"""Fixtures shared by many test files: a warm sandbox reset between tests, the shipped tiny
model as a policy, a tiny BPE model, and a registry with extra domains for one test.

Test tiers: tests marked `slow` (a full job, a live server, a sandboxed family sweep) are part of
the default run; `pytest -m "not slow" -n 2` leaves them out for a quick check, on two processes
(pytest-xdist): a test must not depend on another's side effects or on running alone (its own
`tmp_path`, free ports, its own sandboxes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"
"""the shipped base model"""

if sys.dont_write_bytecode:
    # PYTHONDONTWRITEBYTECODE (set in some shells) makes every test process compile the package
    # and parse and rewrite the asserts of every test module again: half of collection's CPU,
    # paid by each xdist worker, and a CLI subprocess compiles the package again each time. The
    # tests and the Python processes they start keep their compiled files under .pytest_cache
    # instead (out of the source tree, as the setting wants; ignored by git).
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(ROOT / ".pytest_cache" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix


SLOW_MEASURED = frozenset({
    "tests/test_sources_verifiers.py::test_unsupported_environments_are_refused_by_name",
    "tests/test_context_policy.py::test_an_overflowing_episode_continues_by_dropping_and_replays_identically",
    "tests/test_tasks_check.py::test_tasks_graded_at_once_give_the_task_by_task_report",
    "tests/test_exactly_once.py::test_the_publisher_refuses_a_scheduler_out_of_step",
    "tests/test_user_errors.py::test_a_run_whose_evaluation_failed_entirely_exits_non_zero",
    "tests/test_harbor_images.py::test_abuse_is_contained_as_root_in_an_image",
    "tests/test_grading_uids.py::test_a_candidates_daemon_cannot_kill_or_write_the_grader",
    "tests/test_grading_pool.py::test_copying_first_adds_little_to_the_graders_own_timeout",
    "tests/test_family_geometry.py::test_ptgeo_comes_from_the_family_at_its_inside_path",
    "tests/test_vision_training.py::test_an_eval_and_a_grpo_step_on_an_image_domain",
    "tests/test_serve_draft.py::test_draft_model_sampling_follows_the_target_distribution",
    "tests/test_serve_fast.py::test_fast_sampling_follows_the_model_distribution",
    "tests/test_hacks_workspace.py::test_harbor_oracles_still_pass_with_declared_artifacts",
    "tests/test_grading_uids.py::test_tested_code_cannot_rewrite_the_tests_it_is_tested_by",
    "tests/test_grading_pool.py::test_grader_after_an_adversarial_episode_and_grade_sees_none_of_it",
    "tests/test_engine.py::test_the_scheduler_reports_infra_rate_per_version",
    "tests/test_family_terminal.py::test_a_check_that_dies_while_reading_the_workspace_is_a_failed_verdict",
    "tests/test_policy_openai.py::test_server_down_is_a_policy_error_after_bounded_retries",
    "tests/test_family_code.py::test_candidates_that_misbehave_fail_with_a_reason",
    "tests/test_envs_single.py::test_policy_failure_is_infra_error_not_zero_reward",
    "tests/test_sandbox_pool.py::test_reuse_mode_serves_a_caller_that_holds_more_than_size",
    "tests/test_serve_draft.py::test_draft_model_greedy_output_is_the_standard_output_over_loopback",
    "tests/test_family_code.py::test_humaneval_split_and_sampled_canonical_solutions",
    "tests/test_family_rgym.py::test_puzzle24_must_use_the_given_numbers",
    "tests/test_hacks_geometry_answers.py::test_non_finite_answers_fail_before_any_rg_scorer",
    "tests/test_sandbox_pool.py::test_a_caller_waits_for_a_sandbox_being_reset_rather_than_a_boot",
    "tests/test_sandbox_reset.py::test_orphans_of_jobs_are_reaped_by_the_job_server",
    "tests/test_sandbox_reset.py::test_an_episode_cannot_kill_the_job_server_and_leaves_nothing",
    "tests/test_sandbox_reset.py::test_reset_restarts_a_killed_job_server_and_leaves_nothing",
    "tests/test_tasks_check.py::test_check_episodes_take_no_per_turn_snapshots",
    "tests/test_serve.py::test_reload_under_load_keeps_every_request_and_serves_the_new_weights",
    "tests/test_sources_data.py::test_parquet_and_a_saved_dataset_folder",
    "tests/test_vision_training.py::test_images_between_turns_and_shared_prompts_compute_what_each_sequence_alone_does",
    "tests/test_sandbox_cli.py::test_run_reports_the_limit",
    "tests/test_replay_engine.py::test_the_first_infrastructure_failure_in_order_is_reported",
    "tests/test_vision_idefics3.py::test_an_eval_and_a_grpo_step_on_a_tiny_idefics3",
    "tests/test_harbor.py::test_no_reward_or_a_hanging_test_is_a_failure_not_an_infrastructure_error",
    "tests/test_harbor_pool.py::test_an_episode_leaves_nothing_in_the_pooled_sandbox",
    "tests/test_harbor_network.py::test_the_cli_flag_and_the_source_setting",
    "tests/test_train_options.py::test_bf16_autocast_runs_in_bfloat16_close_to_float32",
    "tests/test_split_contamination.py::test_rg_problems_written_two_ways_are_in_one_split",
    "tests/test_sources_verifiers.py::test_a_crashing_reward_function_is_a_failed_verdict_not_a_zero",
    "tests/test_exactly_once.py::test_resuming_an_asynchronous_run_says_it_is_not_exact",
    "tests/test_multiturn_batch.py::test_a_token_in_token_out_episode_is_one_sample_of_its_generated_tokens",
    "tests/test_family_rgym.py::test_generation_is_deterministic_and_leaves_global_random_alone",
    "tests/test_contamination_precision.py::test_distinct_boards_of_two_symbols_are_not_near_duplicates",
})
"""Tests in the slow tier by measurement rather than by kind: each took about a second or more
(call or set-up) in `pytest -m "not slow" -n 2 --durations=45` on a quiet 2-core machine, where the
fast tier's ~940 tests cost ~125 CPU-seconds. Every parametrization of a listed function counts;
the default run (the README's test command) still runs them all. Re-measure and edit when a test
gets faster or a new one crosses the line."""


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.nodeid.split("[", 1)[0] in SLOW_MEASURED:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def module_sandbox(request) -> Iterator[tuple]:
    """One sandbox per test module and a snapshot of its empty workspace. A module may set
    `SANDBOX_PRELOAD` (module names) to warm its sandbox's Python with heavy imports."""
    from posttrain.sandbox import open_sandbox

    preload = tuple(getattr(request.module, "SANDBOX_PRELOAD", ()))
    with open_sandbox(preload=preload) as sb:
        yield sb, sb.snapshot()


@pytest.fixture
def sandbox(module_sandbox):
    """The module's sandbox with an empty workspace again."""
    sb, clean = module_sandbox
    sb.restore(clean)
    return sb


@pytest.fixture(scope="session")
def tiny_policy():
    """`TorchPolicy` on the shipped tiny model, on one CPU thread (shared: tests must not change
    its weights or settings)."""
    import torch

    from posttrain.policies.local import TorchPolicy

    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised GPT-2 with a small byte-level BPE (`test_token_in_out.bpe_dir`),
    built once per test process (tests only read it)."""
    from tests.test_token_in_out import bpe_dir

    return bpe_dir(tmp_path_factory.mktemp("bpe"))


@pytest.fixture
def toy_registry(monkeypatch) -> Callable[..., None]:
    """Returns a function that adds domains to the registry for the duration of a test."""
    from posttrain.tasks import registry

    def add(*domains) -> None:
        current = dict(registry.all_domains())
        current.update({d.name: d for d in domains})
        monkeypatch.setattr(registry, "_domains", current)
    return add


@pytest.fixture(scope="session")
def load_benchmark():
    """`load_benchmark("breadth")`: benchmarks/breadth.py as a module (the benchmarks are scripts,
    not a package), for tests of their own arithmetic. The benchmarks' folder is put on the path, as
    running one as a script does (a benchmark may import its sibling modules)."""
    import importlib.util
    import sys

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))

    def load(name: str):
        path = ROOT / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
