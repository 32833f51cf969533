"""The Ray executor (real Ray, local cluster) gives the same bytes as the local one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.stages.dedup import DedupStage


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray

    tmp = tmp_path_factory.mktemp("ray")
    os.environ["RAY_TMPDIR"] = str(tmp)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp))
    yield ray
    ray.shutdown()


def test_ray_matches_local_bytes(ray_cluster, real_data: Path, tmp_path: Path) -> None:
    inputs = [InputSpec(path=real_data / "alpaca_en_demo/alpaca_en_demo.json", name="alpaca"),
              InputSpec(path=real_data / "messages_kto_demo/v1_sft_demo.jsonl", name="parts")]
    stages = [DedupStage(action="drop")]
    local = Pipeline(stages, workers=1, batch_rows=300).run(inputs, tmp_path / "local")
    remote = Pipeline([DedupStage(action="drop")], executor="ray", workers=2, batch_rows=300).run(
        inputs, tmp_path / "ray")
    assert remote.manifest["counts"] == local.manifest["counts"]
    assert remote.manifest["counts"]["balanced"]
    for sub in ("data", "rejected"):
        for path in sorted((tmp_path / "local" / sub).glob("*.arrow")):
            assert path.read_bytes() == (tmp_path / "ray" / sub / path.name).read_bytes()
    assert remote.timings["workers"] == 2


def test_ray_reads_json_lines_ranges_to_the_same_bytes(ray_cluster, real_data: Path, tmp_path: Path) -> None:
    """A JSON-lines input cut into many byte ranges: Ray workers index and read them
    themselves, and the output is the local executor's, byte for byte."""
    inputs = [InputSpec(path=real_data / "messages_kto_demo/v1_sft_demo.jsonl", name="parts"),
              InputSpec(path=real_data / "alpaca_seed_tasks/seed_tasks.jsonl", name="seed")]
    local = Pipeline([DedupStage(action="drop")], workers=1, batch_rows=40, split_bytes=20_000).run(
        inputs, tmp_path / "local")
    assert local.rows_in > 40 * 10
    remote = Pipeline([DedupStage(action="drop")], executor="ray", workers=2, batch_rows=40,
                      split_bytes=20_000).run(inputs, tmp_path / "ray")
    assert remote.manifest["counts"]["balanced"]
    assert (tmp_path / "ray/manifest.json").read_bytes() == (tmp_path / "local/manifest.json").read_bytes()
    for sub in ("data", "rejected"):
        names = sorted(p.name for p in (tmp_path / "local" / sub).glob("*.arrow"))
        assert names == sorted(p.name for p in (tmp_path / "ray" / sub).glob("*.arrow"))
        for name in names:
            assert (tmp_path / "local" / sub / name).read_bytes() == (tmp_path / "ray" / sub / name).read_bytes()
