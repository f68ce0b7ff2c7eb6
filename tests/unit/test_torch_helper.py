"""The PyTorch helper round-trips model + optimizer through the client (extra `torch`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ckptdrain import torch_helper  # noqa: E402
from ckptdrain.client import Client  # noqa: E402
from ckptdrain.node.steps import completed_steps  # noqa: E402


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def test_save_publishes_and_load_restores_model_and_optimizer(tmp_path: Path) -> None:
    client = Client(tmp_path)
    model, opt = _model()
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    path = torch_helper.save(client, 12, model, opt)
    assert completed_steps(tmp_path) == [12] and path == tmp_path / "step-12"
    (tmp_path / "restore.json").write_text(json.dumps(
        {"fresh_start": False, "step": 12, "path": str(path), "tier": "local"}))
    fresh, fresh_opt = _model()
    assert torch_helper.load(client, fresh, fresh_opt) == 12
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_load_on_a_fresh_start_returns_none(tmp_path: Path) -> None:
    model, opt = _model()
    assert torch_helper.load(Client(tmp_path), model, opt) is None
