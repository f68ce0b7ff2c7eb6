"""admission/census.py's pass over one namespace: each policy's census from
the pod index, written only when it changes, one policy's failed write
stopping no other."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptdrain.operator.admission import census
from ckptdrain.operator.admission import protection as pr
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import status as st
from ckptdrain.sizing import SizingInput, compute

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LOG = logging.getLogger("test")


def _policy(name: str) -> dict[str, Any]:
    status = st.for_sizing(compute(SizingInput(parameters=1e9, interval_s=900)), 1, NOW)
    return {"metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}}}, "status": status}


def test_a_pass_writes_each_policy_once_and_then_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    policies = {("ml", "a"): [_policy("a")], ("ml", "b"): [_policy("b")],
                ("other", "c"): [_policy("c")]}
    pods = {"ml": [
        pr.PodView("bare", labels={"app": "a"}),
        pr.PodView("a-0", policy="a", injected=True, agent=pr.RUNNING, phase="Running"),
        pr.PodView("b-0", policy="b", injected=True, agent=pr.RUNNING, phase="Running"),
        pr.PodView("b-1", policy="b", injected=True, agent=pr.WAITING,
                   created=NOW)]}
    written: dict[str, dict[str, Any]] = {}

    def patch(plural: str, namespace: str, name: str, change: dict[str, Any]) -> bool:
        written[name] = change
        return True

    monkeypatch.setattr(kube, "patch_status", patch)
    assert census.count_namespace("ml", pods, policies, LOG, NOW) == 2  # type: ignore[arg-type]
    assert written["a"]["pods"] == {"selected": 2, "protected": 1, "starting": 0,
                                    "unprotected": 1}
    assert written["a"]["phase"] == "Unprotected" and "bare" in next(
        c for c in written["a"]["conditions"] if c["type"] == "Ready")["message"]
    assert written["b"] == {"pods": {"selected": 2, "protected": 1, "starting": 1,
                                     "unprotected": 0}}
    assert "c" not in written  # another namespace's policy
    # The apiserver took the patches: the next pass has nothing to write.
    for key, name in ((("ml", "a"), "a"), (("ml", "b"), "b")):
        policies[key][0]["status"].update(written[name])
    written.clear()
    assert census.count_namespace("ml", pods, policies, LOG, NOW) == 0  # type: ignore[arg-type]
    assert written == {}


def test_one_failed_write_stops_no_other(monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    policies = {("ml", "a"): [_policy("a")], ("ml", "b"): [_policy("b")]}
    written: list[str] = []

    def patch(plural: str, namespace: str, name: str, change: dict[str, Any]) -> bool:
        if name == "a":
            raise kube.ApiException(status=500, reason="etcd leader changed")
        written.append(name)
        return True

    monkeypatch.setattr(kube, "patch_status", patch)
    assert census.count_namespace("ml", {}, policies, LOG, NOW) == 1  # type: ignore[arg-type]
    assert written == ["b"]
    assert "writing the pod census of policy ml/a failed" in caplog.text
