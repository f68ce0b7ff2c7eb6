"""Unit tests run without an apiserver: the process's view of the
CheckpointClasses is current and empty (no class: the operator's own
settings), unless a test files classes into it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ckptdrain.operator.apiserver import class_view


@pytest.fixture(autouse=True)
def no_checkpoint_classes() -> Iterator[class_view.ClassView]:
    class_view.CLASSES.replace([], "")
    yield class_view.CLASSES
    class_view.CLASSES.replace([], "")
