"""Fidelity's verdict (`passed`) is written into report.json, and reports written before it was both still read."""

from __future__ import annotations

import json

import pytest

from kernelbot.records import Fidelity

FAITHFUL = {"max_abs_logit_diff": 2e-6, "greedy_match": True, "token_agreement": 1.0}
NEAR_TIES = {"max_abs_logit_diff": 0.03, "greedy_match": False, "token_agreement": 0.88, "dtype_noise": 0.02,
             "pack_error": 0.01, "within_noise": True}
CHANGED = {"max_abs_logit_diff": 0.5, "greedy_match": False, "token_agreement": 0.4}
COLLAPSED = {**FAITHFUL, "repetition_collapse": True}


@pytest.mark.parametrize(("fields", "passed"), [(FAITHFUL, True), (NEAR_TIES, True), (CHANGED, False),
                                                (COLLAPSED, False)])
def test_the_written_fidelity_states_whether_it_passed(fields: dict, passed: bool) -> None:
    written = json.loads(Fidelity.model_validate(fields).model_dump_json())
    assert written["passed"] is passed


@pytest.mark.parametrize("fields", [FAITHFUL, NEAR_TIES, CHANGED, COLLAPSED])
def test_old_reports_without_the_verdict_and_new_ones_with_it_read_back_alike(fields: dict) -> None:
    old = Fidelity.model_validate_json(json.dumps(fields))
    new = Fidelity.model_validate_json(old.model_dump_json())
    assert new == old and new.passed == old.passed
    assert new.summary() == old.summary() == Fidelity(**fields).summary()


def test_a_stale_verdict_in_a_report_is_recomputed_from_the_numbers() -> None:
    edited = json.dumps({**CHANGED, "passed": True})
    assert Fidelity.model_validate_json(edited).passed is False
