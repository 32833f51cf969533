"""A two-node Ray cluster (simulated on this machine with ``ray.cluster_utils.Cluster``, one
CPU per node) runs dedup -> near_dedup, both fitted in distributed rounds (a dozen bucket
ranges, several hash ranges), to the bytes the local executor writes."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.dedup import DedupStage
from dataguard.stages.near_dedup import NearDedupStage


@pytest.fixture(scope="module")
def two_nodes(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="dgray", dir="/tmp")  # short: Ray's socket paths have a length limit
    monkeypatch_module.setenv("RAY_TMPDIR", tmp)
    Path(tmp, "ray").mkdir()  # where Ray records the cluster's address
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": str(Path(tmp, "ray")),
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def stages() -> list[Any]:
    near = NearDedupStage(threshold=0.5, validation_sources=["val"])
    near.partition_entries = 5_000  # a dozen bucket ranges: round 1 spreads over both nodes
    dedup = DedupStage(action="drop")
    dedup.rows_per_task = 400
    return [dedup, near]


def output_bytes(folder: Path) -> dict[str, bytes]:
    files = [folder / "manifest.json", *sorted((folder / "data").glob("*.arrow")),
             *sorted((folder / "rejected").glob("*.arrow"))]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def test_two_nodes_write_the_local_bytes(two_nodes: Any, real_data: Path, tmp_path: Path) -> None:
    inputs = [InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca"),
              InputSpec(path=real_data / "messages_kto_demo/v1_sft_demo.jsonl", name="parts"),
              InputSpec(path=real_data / "alpaca_en_demo/identity.json", name="val")]
    assert len([n for n in two_nodes.nodes() if n["Alive"]]) == 2
    local = Pipeline(stages(), workers=1, batch_rows=150).run(inputs, tmp_path / "local")
    remote = Pipeline(stages(), executor="ray", batch_rows=150).run(inputs, tmp_path / "ray")
    assert remote.timings["workers"] == 2
    assert output_bytes(tmp_path / "ray") == output_bytes(tmp_path / "local")
    assert local.manifest["stages"][2]["description"]["summary"]["near_duplicates"] > 100
