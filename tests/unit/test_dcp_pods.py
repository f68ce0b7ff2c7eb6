"""ckptdrain.dcp under torchrun with several processes per pod (CPU, gloo).

Two pods (two torchrun launches, --nnodes=2, one node rank each) of two
processes: writers 0 and 1 of CKPTDRAIN_WRITERS=2, each with its own work
dir. Each pod's published step holds its two ranks' files, writer 0's also
DCP's `.metadata`; the union of both pods' steps loads back with DCP's own
FileSystemReader into whole tensors equal to what was saved.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="ckptdrain.dcp needs PyTorch (the `torch` extra)")
pytest.importorskip("numpy", reason="DCP's object collectives need NumPy (the torch extra)")

import torch.distributed.checkpoint as torch_dcp  # noqa: E402
from tests.support import dcp_pod_worker  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402

from ckptdrain import dcp as ckpt_dcp  # noqa: E402
from ckptdrain.client import Client  # noqa: E402
from ckptdrain.node.steps import completed_steps, is_writing  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "support" / "dcp_pod_worker.py"
PODS, PER_POD = 2, 2
STEPS = [10, 20]  # dcp.save, then async_save
#: A bound on the run (torch's import dominates), not an assertion.
LAUNCH_TIMEOUT = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("pods")
    port = _free_port()
    launches, works = [], []
    for writer in range(PODS):
        work = root / f"pod-{writer}"
        works.append(work)
        env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(work),
               "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(PODS),
               "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
               "OMP_NUM_THREADS": "1"}
        launches.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={PODS}",
             f"--node_rank={writer}", f"--nproc_per_node={PER_POD}",
             "--master_addr=127.0.0.1", f"--master_port={port}",
             str(WORKER), *map(str, STEPS)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=LAUNCH_TIMEOUT)[0] for p in launches]
    for p, out in zip(launches, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    return works


def test_each_pods_step_holds_its_processes_files_and_writer_0_the_metadata(
        pods: list[Path]) -> None:
    for writer, work in enumerate(pods):
        assert completed_steps(work) == sorted(STEPS, reverse=True)
        assert not is_writing(work)
        for step in STEPS:
            names = sorted(os.listdir(work / f"step-{step}"))
            ranks = [writer * PER_POD + local for local in range(PER_POD)]
            expected = [f"__{r}_0.distcp" for r in ranks]
            assert names == sorted(expected + ([".metadata"] if writer == 0 else []))


@pytest.mark.parametrize("step", STEPS)
def test_the_pods_steps_together_load_back_as_saved(pods: list[Path], tmp_path: Path,
                                                     step: int) -> None:
    union = tmp_path / "union"
    union.mkdir()
    for work in pods:
        for name in os.listdir(work / f"step-{step}"):
            os.symlink(work / f"step-{step}" / name, union / name)
    expected = dcp_pod_worker.full_state(step, PODS * PER_POD)
    loaded = {k: torch.zeros_like(v) for k, v in expected.items()}
    torch_dcp.load(loaded, storage_reader=FileSystemReader(union), no_dist=True)
    for key, tensor in expected.items():
        assert torch.equal(loaded[key], tensor), key


def test_several_processes_per_pod_without_a_process_group_are_refused(
        tmp_path: Path) -> None:
    client = Client(tmp_path / "work", environ={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"with 2 process\(es\) per pod but no process group"):
        ckpt_dcp.save({"x": torch.zeros(2)}, client, 1)
    assert not (tmp_path / "work").exists()
