"""An operator upgrade on a real apiserver: the writers of a running job keep
the agent image they started with, a job replaced whole moves to the new
one, and an image the installation never injected is never kept, whatever a
pod's annotations say (operator/admission/agent_pin.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import (
    INJECT,
    JOB_INDEX,
    create,
    get,
    indexed_job,
    owned_by,
    pod,
    policy,
    wait_for,
)
from operator_process import OperatorProcess

from support.apiserver import Cluster

OLD, NEW = "ckptdrain:release-1", "ckptdrain:release-2"
AGENT = "ckptdrain-agent"
GRACE = {"terminationGracePeriodSeconds": 30}




def _images(stored: dict[str, Any]) -> set[str]:
    """Every image the webhook put in the pod (the trainer's aside)."""
    spec = stored["spec"]
    return {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]
            if c["name"] != "trainer"}


@pytest.fixture(params=["own-process", "in-operator"])
def upgrade(request: pytest.FixtureRequest, cluster: Cluster, operator: OperatorProcess,
            tmp_path: Path, namespace: str) -> Iterator[Callable[[str], OperatorProcess]]:
    """`upgrade(image)`: the operator (stopped before) started again as a
    release injecting `image`, recording into one ConfigMap per test;
    admission served by its own process (the default) or by the operator's."""
    operator.stop()
    record = f"default/agent-images-{namespace}"
    running: list[OperatorProcess] = []

    def start(image: str) -> OperatorProcess:
        for proc in running:
            proc.stop()
        workdir = tmp_path / image.replace(":", "-")
        workdir.mkdir(exist_ok=True)
        proc = OperatorProcess(cluster, workdir, CKPTDRAIN_IMAGE=image,
                               CKPTDRAIN_AGENT_IMAGES=record,
                               CKPTDRAIN_WEBHOOK_PROCESS=str(request.param == "own-process"
                                                             ).lower())
        proc.start()
        running.append(proc)
        wait_for(lambda: image in _recorded(cluster, record), timeout_s=60,
                 what=f"{image} recorded")
        return proc

    try:
        yield start
    finally:
        for proc in running:
            proc.stop()
        cluster.kubectl("delete", "-n", "default", "configmap", record.split("/")[1],
                        "--ignore-not-found", check=False)
        operator.start()


def _recorded(cluster: Cluster, record: str) -> str:
    namespace, name = record.split("/")
    found = cluster.kubectl("get", "-n", namespace, "configmap", name, "-o", "json",
                            check=False)
    return found.stdout if found.returncode == 0 else ""


def test_writers_keep_their_agent_image_across_an_upgrade_until_replaced_together(
        cluster: Cluster, namespace: str, apply: Callable[..., Any],
        upgrade: Callable[[str], OperatorProcess]) -> None:
    upgrade(OLD)
    apply(policy("pin", writers=3))
    job = indexed_job(cluster, namespace, "train", 3)

    def writer(index: int) -> Any:
        body = pod(f"train-{index}", {"app": "pin", **INJECT, JOB_INDEX: str(index)},
                   index, **GRACE)
        return create(cluster, namespace, owned_by(body, job))

    def recreate(index: int) -> Any:
        cluster.kubectl("delete", "-n", namespace, "pod", f"train-{index}", "--wait=true",
                        "--grace-period=0", "--force", check=False)
        return wait_for(lambda: (lambda made: made if made.returncode == 0 else None)(
            writer(index)), what=f"train-{index} admitted again")

    for index in range(3):
        made = wait_for(lambda i=index: (lambda m: m if m.returncode == 0 else None)(
            writer(i)), what=f"train-{index} admitted")
        stored = json.loads(made.stdout)
        assert _images(stored) == {OLD}
        assert stored["metadata"]["annotations"]["ckptdrain.io/agent-image"] == OLD

    upgrade(NEW)
    # One rank replaced while the two others run: it keeps their image, and says so.
    made = recreate(1)
    stored = json.loads(made.stdout)
    assert _images(stored) == {OLD}, "a replaced rank mixed agent releases in one job"
    assert stored["metadata"]["annotations"]["ckptdrain.io/agent-image"] == OLD
    assert f"agent image {OLD} kept" in made.stderr, made.stderr

    # A pod's annotation is its own to edit, but an image never recorded is
    # never given: the replacement gets the operator's own and is told why.
    for index in (0, 2):
        cluster.kubectl("annotate", "-n", namespace, "pod", f"train-{index}",
                        "--overwrite", "ckptdrain.io/agent-image=registry.example/evil:1")
    made = recreate(1)
    assert _images(json.loads(made.stdout)) == {NEW}
    assert "not among the agent images this installation recorded" in made.stderr

    # The whole job replaced at once (every old pod gone): it moves to NEW.
    for index in range(3):
        cluster.kubectl("delete", "-n", namespace, "pod", f"train-{index}", "--wait=true",
                        "--grace-period=0", "--force", check=False)
    for index in range(3):
        made = wait_for(lambda i=index: (lambda m: m if m.returncode == 0 else None)(
            writer(i)), what=f"train-{index} admitted after the restart")
        assert _images(json.loads(made.stdout)) == {NEW}
    assert OLD in _recorded(cluster, f"default/agent-images-{namespace}")


def test_a_writer_of_another_job_generation_is_not_held_back_by_the_old_one(
        cluster: Cluster, namespace: str, apply: Callable[..., Any],
        upgrade: Callable[[str], OperatorProcess]) -> None:
    """Pinning is per workload generation: a Job deleted and made again under
    its name is a new one, even while a pod of the old one still runs."""
    upgrade(OLD)
    apply(policy("gen", writers=2))
    first = indexed_job(cluster, namespace, "first", 2)

    def admitted(index: int, job: dict[str, Any]) -> dict[str, Any]:
        body = pod(f"first-{index}", {"app": "gen", **INJECT, JOB_INDEX: str(index)},
                   index, **GRACE)
        made = wait_for(lambda: (lambda m: m if m.returncode == 0 else None)(
            create(cluster, namespace, owned_by(body, job))), what=f"first-{index} admitted")
        return dict(json.loads(made.stdout))

    assert all(_images(admitted(i, first)) == {OLD} for i in range(2))
    upgrade(NEW)
    # No garbage collector runs here: its pods stay, as they would for a while.
    cluster.kubectl("delete", "-n", namespace, "job", "first", "--cascade=background")
    again = indexed_job(cluster, namespace, "first", 2)
    cluster.kubectl("delete", "-n", namespace, "pod", "first-0", "--wait=true",
                    "--grace-period=0", "--force", check=False)
    # first-1 of the old Job still runs OLD; the new Job's pod gets NEW.
    assert _images(admitted(0, again)) == {NEW}
    assert get(cluster, namespace, "pod", "first-1")["metadata"]["annotations"][
        "ckptdrain.io/agent-image"] == OLD
