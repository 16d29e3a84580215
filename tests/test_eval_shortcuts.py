"""The commonest-answer shift: how far a policy settled on one answer per domain."""

from __future__ import annotations

from types import SimpleNamespace

from posttrain.evaluation.shortcuts import answer_shift, final_answers, largest_rise


def test_the_rise_of_the_commonest_answer_and_what_it_earns():
    before = {"count": [("2", True), ("0", False), ("1", False), ("3", False)],
              "other": [("a", True), ("b", False)]}
    after = {"count": [("0", False), ("0", True), ("0", False), ("2", True)],
             "other": [("a", True), ("a", True)], "after_only": [("x", True)]}
    shift = answer_shift(before, after)
    assert set(shift) == {"count", "other"}  # scored on both sides only
    assert shift["count"] == {"answer": "0", "share_before": 0.25, "share_after": 0.75, "rise": 0.5,
                              "pass1_before": 0.25, "pass1_after": 0.5, "pass1_by_answer": 0.25}
    assert shift["other"]["rise"] == 0.5 and shift["other"]["pass1_by_answer"] == 1.0
    assert largest_rise(shift) == ("other", 0.5)  # a tie goes to the later name, deterministically
    assert largest_rise(shift, ["count"]) == ("count", 0.5)
    assert largest_rise(shift, ["nothing"]) == (None, None)


def test_final_answers_leave_out_infrastructure_errors():
    def traj(domain, action, passed, status="completed"):
        return SimpleNamespace(domain=domain, status=status, passed=passed,
                               turns=[SimpleNamespace(action="think"), SimpleNamespace(action=f" {action}\n")])

    store = SimpleNamespace(trajectories=lambda run_id: iter([
        traj("d", "7", True), traj("d", "8", False), traj("d", "", None, status="infra_error")]))
    assert final_answers(store, "eval:after") == {"d": [("7", True), ("8", False)]}
