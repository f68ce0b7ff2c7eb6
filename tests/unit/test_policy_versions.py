"""CheckpointPolicy between ckptdrain.io/v1alpha1 and v1beta1: each field
whose type differs converts both ways to the same value, everything else is
carried, and what does not read is carried unchanged."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptdrain.contract import policy_versions as pv
from ckptdrain.errors import InvalidInput

CRD = Path(__file__).resolve().parents[2] / "crds" / "checkpointpolicies.yaml"


@functools.cache
def v1alpha1_schema(path: str) -> dict[str, Any]:
    """The v1alpha1 schema of a field ("spec.model.parameters") in the CRD."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    for key in path.split("."):
        schema = schema["properties"][key]
    return schema


def nested(path: str, value: object, api_version: str = pv.V1ALPHA1) -> dict[str, Any]:
    """A CheckpointPolicy holding only `value` at `path`."""
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": "CheckpointPolicy",
                           "metadata": {"name": "p", "namespace": "ns"}}
    holder = obj
    *parents, name = path.split(".")
    for key in parents:
        holder = holder.setdefault(key, {})
    holder[name] = value
    return obj


def at(obj: dict[str, Any], path: str) -> object:
    for key in path.split("."):
        obj = obj[key]
    return obj


def up(path: str, value: object) -> object:
    return at(pv.to_v1beta1(nested(path, value)), path)


def down(path: str, value: object) -> object:
    return at(pv.to_v1alpha1(nested(path, value, pv.V1BETA1)), path)


# The issue's own examples, and one of each unit for every field.
#: One interruption as the operator writes it (ckptdrain.goodput), and in v1beta1:
#: every time RFC3339, the durations and counts as they are.
INTERRUPTION_V1ALPHA1 = {
    "pod": "p-0", "writer": 0, "at": 1796000523.5, "step": 12,
    "completed": {"10": 1796000400.125, "11": 1796000460.0},
    "restoreStartedAt": 1796000583.25, "resourcesAt": 1796000553.0, "waitingSeconds": 29.5,
    "trainingAt": 1796000643.75, "recoverySeconds": 120.25,
    "lostSeconds": 63.375, "restoredStep": 11}
INTERRUPTION_V1BETA1 = {
    **INTERRUPTION_V1ALPHA1, "at": "2026-11-30T01:02:03.500000Z",
    "completed": {"10": "2026-11-30T01:00:00.125000Z", "11": "2026-11-30T01:01:00.000000Z"},
    "restoreStartedAt": "2026-11-30T01:03:03.250000Z",
    "resourcesAt": "2026-11-30T01:02:33.000000Z",
    "trainingAt": "2026-11-30T01:04:03.750000Z"}

UP = [
    ("spec.model.parameters", "405B", "405G"),
    ("spec.model.parameters", "1.5T", "1.5T"),
    ("spec.model.parameters", "4.05e11", "4.05e11"),
    ("spec.model.parameters", "70M", "70M"),
    ("spec.model.parameters", "70K", "70k"),
    ("spec.model.parameters", "405 B", "405G"),
    ("spec.model.parameters", "405000000000", 405000000000),
    ("spec.model.bytesPerParameter", 14, 14),
    ("spec.model.bytesPerParameter", 14.0, 14),
    ("spec.model.bytesPerParameter", 12.5, "12.5"),
    ("spec.model.bytesPerParameter", 0.00001, "0.00001"),
    ("spec.model.checkpointBytes", "5.67TB", "5.67T"),
    ("spec.model.checkpointBytes", "1.5TiB", "1.5Ti"),
    ("spec.model.checkpointBytes", "800GB", "800G"),
    ("spec.model.checkpointBytes", "2e12", "2e12"),
    ("spec.model.checkpointBytes", "1048576", 1048576),
    ("spec.model.checkpointBytes", "512B", 512),
    ("spec.localTier.capacity", "8TB", "8T"),
    ("spec.localTier.capacity", "8Ti", "8Ti"),
    ("spec.localTier.capacity", "1.5 EB", "1.5E"),
    ("spec.localTier.memory.sizeLimit", "64GB", "64G"),
    ("spec.localTier.memory.sizeLimit", "64Gi", "64Gi"),
    ("spec.localTier.memory.sizeLimit", "4KB", "4k"),
    ("spec.peerTier.capacity", "2TB", "2T"),
    ("spec.peerTier.capacity", "1.5PiB", "1.5Pi"),
    ("spec.caps.bandwidth", "10GB/s", "10G"),
    ("spec.caps.bandwidth", "1.25GiB/s", "1.25Gi"),
    ("spec.caps.bandwidth", "500M", "500M"),
    ("spec.caps.bandwidth", "500 MB/s", "500M"),
    ("spec.caps.perDrainer", "2GB/s", "2G"),
    ("spec.caps.perDrainer", "100B/s", 100),
    ("spec.caps.perDrainer", "1.5KB/s", "1.5k"),
    ("spec.interval", "15m", "15m"),
    ("spec.interval", "1d", "24h"),
    ("spec.interval", "90", "90s"),
    ("spec.interval", "1.5", "1.5s"),
    ("spec.interval", "1h30m", "1h30m"),
    ("spec.interval", "1.5h", "1.5h"),
    ("spec.mtti", "1.5d", "36h"),
    ("spec.mtti", "2d12h", "60h"),
    ("spec.localWriteTime", "250ms", "250ms"),
    ("spec.localWriteTime", "0.0000001d", "0.00864s"),
    ("spec.restore.retryDeadline", "0", "0s"),
    ("spec.restore.retryDeadline", "10m", "10m"),
    ("spec.restore.agreementTimeout", "1.1d", "26h24m"),
    ("spec.drain.stallTimeout", "300", "300s"),
    ("spec.overlap", "0.1", "10%"),
    ("spec.overlap", "10%", "10%"),
    ("spec.overlap", "0.125", "12.5%"),
    ("spec.overlap", "1", "100%"),
    ("spec.overlap", ".5", "50%"),
    ("spec.overlap", "12.5 %", "12.5%"),
    ("status.lastRestoreAgreement.startedAt", 1796000523.123456, "2026-11-30T01:02:03.123456Z"),
    ("status.lastRestoreFailure.startedAt", 1796000523, "2026-11-30T01:02:03.000000Z"),
    ("status.goodput.heldSince", 1796000523.5, "2026-11-30T01:02:03.500000Z"),
    ("status.goodput.endedAt", 0.000001, "1970-01-01T00:00:00.000001Z"),
    ("status.goodput.lastInterruption", {"pod": "p-0", "at": 1796000523.5, "lostSteps": 3},
     {"pod": "p-0", "at": "2026-11-30T01:02:03.500000Z", "lostSteps": 3}),
    ("status.goodput.recent", [INTERRUPTION_V1ALPHA1, "not an entry"],
     [INTERRUPTION_V1BETA1, "not an entry"]),
]


@pytest.mark.parametrize(("path", "v1alpha1", "v1beta1"), UP)
def test_v1alpha1_values_convert_to_v1beta1(path: str, v1alpha1: object, v1beta1: object) -> None:
    assert up(path, v1alpha1) == v1beta1


DOWN = [
    ("spec.model.parameters", 405000000000, "405000000000"),
    ("spec.model.parameters", "405G", "405G"),
    ("spec.model.parameters", "4.05e11", "4.05e11"),
    ("spec.model.bytesPerParameter", 14, 14),
    ("spec.model.bytesPerParameter", "12.5", 12.5),
    ("spec.model.bytesPerParameter", "14", 14),
    ("spec.model.checkpointBytes", "5.67T", "5.67T"),
    ("spec.model.checkpointBytes", 1048576, "1048576"),
    ("spec.localTier.capacity", "8Ti", "8Ti"),
    ("spec.localTier.memory.sizeLimit", "64Gi", "64Gi"),
    ("spec.peerTier.capacity", 2000000000000, "2000000000000"),
    ("spec.caps.bandwidth", "10G", "10G"),
    ("spec.caps.perDrainer", 2000000000, "2000000000"),
    ("spec.interval", "24h", "24h"),
    ("spec.mtti", "1h30m", "1h30m"),
    ("spec.localWriteTime", "250ms", "250ms"),
    ("spec.restore.retryDeadline", "0s", "0s"),
    ("spec.restore.agreementTimeout", "1m", "1m"),
    ("spec.drain.stallTimeout", "5m", "5m"),
    ("spec.overlap", "12.5%", "12.5%"),
    ("status.lastRestoreAgreement.startedAt", "2026-11-30T01:02:03.123456Z", 1796000523.123456),
    ("status.lastRestoreFailure.startedAt", "2026-11-30T01:02:03Z", 1796000523.0),
    ("status.goodput.heldSince", "2026-11-30T03:02:03.5+02:00", 1796000523.5),
    ("status.goodput.endedAt", "2026-11-30t01:02:03.25z", 1796000523.25),
    ("status.goodput.lastInterruption", {"pod": "p-0", "at": "2026-11-30T01:02:03.500000Z"},
     {"pod": "p-0", "at": 1796000523.5}),
    ("status.goodput.recent", [INTERRUPTION_V1BETA1], [INTERRUPTION_V1ALPHA1]),
]


@pytest.mark.parametrize(("path", "v1beta1", "v1alpha1"), DOWN)
def test_v1beta1_values_convert_to_v1alpha1(path: str, v1beta1: object, v1alpha1: object) -> None:
    converted = down(path, v1beta1)
    assert converted == v1alpha1 and type(converted) is type(v1alpha1)


def test_every_field_whose_type_differs_is_in_both_tables() -> None:
    """A field added to FIELDS without an example here would go untested."""
    assert {p for p, _, _ in UP} == set(pv.FIELDS) == {p for p, _, _ in DOWN}


def test_times_are_utc_with_microseconds() -> None:
    assert up("status.goodput.heldSince", -1.25) == "1969-12-31T23:59:58.750000Z"
    assert up("status.goodput.heldSince", 1796000523.1234567) == "2026-11-30T01:02:03.123457Z"


def test_a_unix_time_an_earlier_release_stored_at_v1beta1_reads_as_it_is() -> None:
    """Before trainingAt converted, v1beta1 stored it as Unix seconds: the
    operator reads that entry back unchanged until it rewrites it."""
    stored = {"pod": "p-0", "at": "2026-11-30T01:02:03.500000Z", "trainingAt": 1796000643.75}
    assert down("status.goodput.recent", [stored]) == [
        {"pod": "p-0", "at": 1796000523.5, "trainingAt": 1796000643.75}]


@pytest.mark.parametrize("path", ["status.goodput.heldSince", "status.goodput.endedAt"])
def test_a_null_time_stays_null(path: str) -> None:
    assert up(path, None) is None and down(path, None) is None


def test_the_v1alpha1_defaults_are_v1beta1_spellings_of_themselves() -> None:
    """What the apiserver defaults in v1alpha1 reads the same in v1beta1."""
    defaults = {path: v1alpha1_schema(path)["default"] for path in pv.FIELDS
                if path.startswith("spec.") and "default" in v1alpha1_schema(path)}
    assert defaults == {"spec.model.bytesPerParameter": 14, "spec.overlap": "10%",
                        "spec.restore.retryDeadline": "10m",
                        "spec.restore.agreementTimeout": "1m", "spec.drain.stallTimeout": "5m"}
    for path, value in defaults.items():
        assert up(path, value) == value
        assert down(path, value) == value


def test_conversion_adds_no_defaults() -> None:
    """Defaulting is the apiserver's, per version: an absent field stays absent."""
    obj = {"apiVersion": pv.V1ALPHA1, "kind": "CheckpointPolicy", "metadata": {"name": "p"},
           "spec": {"model": {"parameters": "7B"}}}
    assert pv.to_v1beta1(obj)["spec"] == {"model": {"parameters": "7G"}}
    assert pv.to_v1alpha1(pv.to_v1beta1(obj))["spec"] == {"model": {"parameters": "7G"}}


UNREAD = [
    ("spec.model.parameters", "lots"), ("spec.model.parameters", "405X"),
    ("spec.model.parameters", "1e99999B"), ("spec.model.parameters", "-5"),
    ("spec.model.bytesPerParameter", "fourteen"), ("spec.model.bytesPerParameter", True),
    ("spec.model.checkpointBytes", "1kiB"), ("spec.model.checkpointBytes", "5.67 TeraBytes"),
    ("spec.localTier.capacity", ["8Ti"]), ("spec.localTier.memory.sizeLimit", {"Gi": 64}),
    ("spec.caps.bandwidth", "fast"), ("spec.caps.perDrainer", "10GB/min"),
    ("spec.interval", "1 fortnight"), ("spec.interval", "1h30"), ("spec.mtti", "+5"),
    ("spec.restore.retryDeadline", "1" * 2000 + "s"), ("spec.localWriteTime", 90),
    ("spec.overlap", "ten percent"), ("spec.overlap", "10‰"),
    ("status.goodput.heldSince", "yesterday"), ("status.goodput.endedAt", "2026-13-01T00:00:00Z"),
    ("status.lastRestoreFailure.startedAt", float("inf")),
    ("status.lastRestoreAgreement.startedAt", 1e300),
]


@pytest.mark.parametrize(("path", "value"), UNREAD)
def test_a_value_that_does_not_read_is_carried_unchanged(path: str, value: object) -> None:
    assert up(path, value) == value
    assert down(path, value) == value


def test_values_admission_would_refuse_keep_their_value() -> None:
    """Range is admission's, the same in both versions: the value is respelled."""
    assert up("spec.overlap", "1.5") == "150%"
    assert up("spec.overlap", "0") == "0%"
    assert up("spec.model.parameters", "0B") == "0G"


def test_sections_absent_null_or_of_another_type_are_carried() -> None:
    for spec in ({}, {"model": None}, {"model": "7B"}, {"localTier": {"path": "/x"}},
                 {"localTier": {"memory": None}}, {"caps": []}, {"restore": {"enabled": False}}):
        obj = {"apiVersion": pv.V1ALPHA1, "kind": "CheckpointPolicy", "spec": spec}
        assert pv.to_v1beta1(obj)["spec"] == spec
        assert pv.to_v1alpha1(obj)["spec"] == spec
    for obj in ({"kind": "CheckpointPolicy"}, {"kind": "CheckpointPolicy", "spec": None},
                {"kind": "CheckpointPolicy", "status": {"goodput": None}}):
        assert {k: v for k, v in pv.to_v1beta1(obj).items() if k != "apiVersion"} == obj


def test_a_whole_policy_converts_field_by_field_and_carries_the_rest() -> None:
    v1alpha1 = {
        "apiVersion": pv.V1ALPHA1, "kind": "CheckpointPolicy",
        "metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "12",
                     "uid": "u-1", "labels": {"team": "a"}, "annotations": {"x": "y"},
                     "managedFields": [{"manager": "kubectl"}]},
        "spec": {"selector": {"matchLabels": {"app": "llama"}},
                 "model": {"parameters": "405B", "bytesPerParameter": 14},
                 "interval": "1d", "overlap": "0.1", "writers": 8, "futureField": {"a": "1d"},
                 "localTier": {"path": "/mnt/nvme", "keep": 2, "capacity": "8TB",
                               "memory": {"sizeLimit": "64GiB"}},
                 "caps": {"bandwidth": "10GB/s"}, "restore": {"retryDeadline": "90"},
                 "storage": {"uri": "s3://b/p"}},
        "status": {"phase": "Ready", "observedGeneration": 3,
                   "conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-11-30T00:00:00Z"}],
                   "goodput": {"heldSince": 1796000523.5, "endedAt": None, "interruptions": 2}},
        "extra": [1, 2],
    }
    v1beta1 = pv.to_v1beta1(v1alpha1)
    assert v1beta1["apiVersion"] == "ckptdrain.io/v1beta1"
    assert v1beta1["metadata"] == v1alpha1["metadata"]
    assert v1beta1["spec"] == {
        **v1alpha1["spec"], "model": {"parameters": "405G", "bytesPerParameter": 14},
        "interval": "24h", "overlap": "10%",
        "localTier": {"path": "/mnt/nvme", "keep": 2, "capacity": "8T",
                      "memory": {"sizeLimit": "64Gi"}},
        "caps": {"bandwidth": "10G"}, "restore": {"retryDeadline": "90s"}}
    assert v1beta1["status"] == {**v1alpha1["status"], "goodput": {
        "heldSince": "2026-11-30T01:02:03.500000Z", "endedAt": None, "interruptions": 2}}
    assert v1beta1["extra"] == [1, 2]
    back = pv.to_v1alpha1(v1beta1)
    assert back["apiVersion"] == "ckptdrain.io/v1alpha1"
    assert back["metadata"] == v1alpha1["metadata"]
    assert back["status"] == v1alpha1["status"]
    assert back["spec"]["interval"] == "24h" and back["spec"]["restore"] == {
        "retryDeadline": "90s"}


def test_the_input_is_never_mutated_nor_shared() -> None:
    obj = nested("spec.model.parameters", "405B")
    obj["spec"]["caps"] = {"bandwidth": "10GB/s"}
    obj["status"] = {"goodput": {"heldSince": 1.5}}
    before = copy.deepcopy(obj)
    for converted in (pv.to_v1beta1(obj), pv.to_v1alpha1(obj), pv.convert(obj, pv.V1BETA1),
                      pv.convert(obj, pv.V1ALPHA1)):
        assert obj == before
        converted["metadata"]["name"] = "changed"
        converted["spec"]["caps"]["bandwidth"] = "changed"
        assert obj == before


def test_convert_goes_either_way_and_keeps_the_same_version_as_it_is() -> None:
    v1alpha1 = nested("spec.interval", "1d")
    v1beta1 = pv.convert(v1alpha1, "ckptdrain.io/v1beta1")
    assert at(v1beta1, "spec.interval") == "24h"
    assert pv.convert(v1beta1, "ckptdrain.io/v1alpha1") == nested("spec.interval", "24h")
    assert pv.convert(v1alpha1, "ckptdrain.io/v1alpha1") == v1alpha1
    assert pv.convert(v1beta1, "ckptdrain.io/v1beta1") == v1beta1


@pytest.mark.parametrize(("obj", "desired", "field", "seen"), [
    ({"apiVersion": "v1", "kind": "Pod"}, pv.V1BETA1, "kind", "Pod"),
    ({"apiVersion": "ckptdrain.io/v2", "kind": "CheckpointPolicy"}, pv.V1BETA1,
     "apiVersion", "ckptdrain.io/v2"),
    ({"kind": "CheckpointPolicy"}, pv.V1BETA1, "apiVersion", None),
    (nested("spec.interval", "1d"), "ckptdrain.io/v1", "desiredAPIVersion", "ckptdrain.io/v1"),
    (nested("spec.interval", "1d"), None, "desiredAPIVersion", None),
    (["not", "an", "object"], pv.V1BETA1, "object", "list"),
])
def test_convert_refuses_what_is_not_a_known_checkpoint_policy(
        obj: object, desired: object, field: str, seen: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        pv.convert(obj, desired)
    assert (caught.value.field, caught.value.seen) == (field, seen)
    assert str(caught.value).startswith(f"{field}: expected ")


def test_the_class_name_is_carried_both_ways_verbatim() -> None:
    """spec.checkpointClassName has one type in both versions: conversion
    never drops nor rewrites it (a lost name would move a policy to the
    default class)."""
    v1alpha1 = {"apiVersion": pv.V1ALPHA1, "kind": "CheckpointPolicy",
                "metadata": {"name": "llama", "namespace": "ml"},
                "spec": {"checkpointClassName": "fast-nvme", "interval": "1d",
                         "storage": {"uri": "s3://b/p"}}}
    v1beta1 = pv.to_v1beta1(v1alpha1)
    assert v1beta1["spec"]["checkpointClassName"] == "fast-nvme"
    assert v1beta1["spec"]["interval"] == "24h"
    assert pv.to_v1alpha1(v1beta1)["spec"]["checkpointClassName"] == "fast-nvme"
