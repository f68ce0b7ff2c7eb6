"""apiserver/kube.py's LIST of the opted-in pods: metadata only, each page
bounded in time, every page followed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckptdrain.operator.apiserver import kube


class _Page:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class _Core:
    """Two pages of pod metadata, and what each call asked for."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def list_pod_for_all_namespaces(self, **options: Any) -> _Page:
        self.calls.append(options)
        if options["_continue"] is None:
            return _Page({"kind": "PartialObjectMetadataList", "metadata": {"continue": "t1"},
                          "items": [{"metadata": {"namespace": "ml", "name": "w-0",
                                                  "uid": "u0"}}]})
        return _Page({"kind": "PartialObjectMetadataList", "metadata": {},
                      "items": [{"metadata": {"namespace": "ci", "name": "w-1"}}]})


def test_the_list_fetches_metadata_only_each_page_within_a_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = _Core()
    monkeypatch.setattr(kube, "_clients", lambda: (core, None))
    assert kube.list_pod_names(None, "ckptdrain.io/inject=true") == {("ml", "w-0"),
                                                                      ("ci", "w-1")}
    assert [c["_continue"] for c in core.calls] == [None, "t1"]
    for call in core.calls:
        assert call["_headers"]["Accept"].startswith(
            "application/json;as=PartialObjectMetadataList")
        assert call["_request_timeout"] == kube.POD_PAGE_TIMEOUT
        assert call["_preload_content"] is False
        assert call["limit"] == kube.POD_PAGE
        assert call["label_selector"] == "ckptdrain.io/inject=true"


def test_a_page_of_full_pods_reads_the_same() -> None:
    page = {"metadata": {"continue": ""}, "items": [
        {"metadata": {"namespace": "ml", "name": "w-0"}, "spec": {}, "status": {}}]}
    assert kube.pod_names_of(page) == ({("ml", "w-0")}, None)
