"""docs/goodput.md's status example: its times are what v1beta1 shows
(RFC3339, as the operator writes them), the figures beside them agree with
them, and at v1alpha1 they read as the Unix seconds the page says."""

from __future__ import annotations

import re
from typing import Any

import yaml
from tests.docs import blocks
from tests.docs.blocks import REPO

from ckptdrain import goodput, restore_status
from ckptdrain.contract import api
from ckptdrain.contract import policy_versions as pv
from ckptdrain.contract.goodput import PodView, RestoreView
from ckptdrain.contract.policy_versions import status_times

PAGE = REPO / "docs" / "goodput.md"
RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


def status_example() -> dict[str, Any]:
    (block,) = [b for b in blocks.parse(PAGE)
                if b.kind == "fragment" and b.text.startswith("status:\n  goodput:")]
    return yaml.safe_load(block.text)["status"]


def times(status: dict[str, Any]) -> dict[str, Any]:
    """Every time the example shows (`at`, `…At`, heldSince, endedAt), by where it is."""
    g = status["goodput"]
    found = {f"goodput.{k}": g[k] for k in ("heldSince", "endedAt") if k in g}
    holders = {"goodput.lastInterruption": g["lastInterruption"],
               "lastRestoreFailure": status["lastRestoreFailure"],
               **{f"goodput.recent[{i}]": e for i, e in enumerate(g["recent"])}}
    for where, holder in holders.items():
        found.update({f"{where}.{k}": v for k, v in holder.items()
                      if k == "at" or k.endswith("At")})
    return found


def test_the_status_example_shows_rfc3339_times() -> None:
    shown = times(status_example())
    assert {"goodput.recent[0].trainingAt", "goodput.recent[0].resourcesAt",
            "goodput.recent[0].restoreStartedAt", "goodput.recent[0].at",
            "lastRestoreFailure.startedAt"} <= set(shown)
    assert {k: v for k, v in shown.items()
            if not (isinstance(v, str) and RFC3339.fullmatch(v))} == {}


def test_the_status_example_shows_what_the_operator_stores() -> None:
    """No null (a merge patch's null removes its key: the job that still runs
    has no `endedAt`), and a restore failure shows every key the operator
    writes for a writer's."""
    status = status_example()
    assert api.as_stored(status) == status
    assert "endedAt" not in status["goodput"]
    failure = status["lastRestoreFailure"]
    written = restore_status.restore_failure([PodView(failure["pod"], failure["writer"], restore=(
        RestoreView(outcome=failure["outcome"], started_at=0.0, seconds=1.0,
                    reason=failure["reason"], attempts=failure.get("attempts", 1))))])
    assert written is not None and set(written) == set(failure)


def test_the_interruption_times_api_versions_names_are_where_the_operator_puts_them() -> None:
    """lastInterruption is the short form: of the times, only `at`."""
    text = (REPO / "docs" / "api-versions.md").read_text()
    short = goodput.summary({k: 1.0 for k in status_times.INTERRUPTION_TIMES})
    (row,) = re.findall(r"in `status\.goodput\.lastInterruption`[^:|]*: ([^;|]*)", text)
    assert set(re.findall(r"`(\w+)`", row)) == set(short) == {"at"}


def test_at_v1alpha1_the_example_is_unix_seconds_that_agree_with_its_figures() -> None:
    v1beta1 = {"apiVersion": pv.V1BETA1, "kind": api.KIND_POLICY, "status": status_example()}
    v1alpha1 = pv.convert(v1beta1, pv.V1ALPHA1)
    status = v1alpha1["status"]
    assert all(isinstance(v, float) for v in times(status).values()), times(status)
    assert status["goodput"]["heldSince"] == 1763900010.0  # as the page says
    (entry,) = status["goodput"]["recent"]
    assert entry["waitingSeconds"] == entry["resourcesAt"] - entry["at"]
    assert entry["recoverySeconds"] == entry["trainingAt"] - entry["at"]
    assert entry["at"] <= entry["resourcesAt"] <= entry["restoreStartedAt"] \
        <= entry["trainingAt"]
    assert status["goodput"]["lastInterruption"] == goodput.summary(entry)
    # Written back at v1beta1, the operator's own spelling: the page exactly.
    assert pv.convert(v1alpha1, pv.V1BETA1) == v1beta1
