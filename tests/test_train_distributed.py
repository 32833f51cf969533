"""Two training processes under a real ``torchrun`` (DDP through accelerate, gloo on CPU).

(``accelerate launch --cpu`` starts one process: it spreads CPU jobs only through mpirun;
torchrun sets RANK/WORLD_SIZE and accelerate's Accelerator takes it from there, as it does
under ``accelerate launch --multi_gpu`` on GPUs.)

The loop gives every process the same seeded micro-batch and trains each on its slice
``rows[rank::world]``; DDP averages the gradients. With uniform weights and equal slices the
average of the slice losses is the full batch's loss, so two processes must reach the weights
one process reaches (up to float summation order), and only rank 0 may write the run folder.
The tiny causal LM has no dropout, so the runs are comparable step for step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dataguard.io.readers import InputSpec
from dataguard.pipeline import Pipeline
from dataguard.train.checkpoint import complete_checkpoints, latest_checkpoint, read_weights

REPO = Path(__file__).resolve().parent.parent
STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp: Path, data: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"train": {
        "task": "sft", "model": "tiny-causal-lm", "data": str(data), "output": str(tmp / name),
        "max_steps": STEPS, "batch_size": 4, "lr": 3e-3, "max_length": 64, "eval_every": 2,
        "save_every": STEPS // 2, "keep_checkpoints": 2, "tensorboard": False, "log_every": 1, "seed": 3, "device": "cpu",
        "threads": 1}}))
    return path


def _launch(config: Path, processes: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if processes == 1:
        cmd = [sys.executable, "-m", "dataguard", "train", str(config)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "dataguard", "train",
               str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


def test_two_processes_train_like_one_and_only_rank_zero_writes(tmp_path):
    data = tmp_path / "shards"
    Pipeline([], workers=1).run([InputSpec(path=str(REPO / "sample_data/alpaca_en_demo.json"))], data)
    one = _launch(_config(tmp_path, data, "one"), 1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _launch(_config(tmp_path, data, "two"), 2)
    assert two.returncode == 0, two.stderr[-3000:]

    run = tmp_path / "two"
    record = json.loads((run / "run.json").read_text())
    assert record["total_steps"] == STEPS and record["processes"] == 2
    assert json.loads((tmp_path / "one" / "run.json").read_text())["processes"] == 1
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == list(range(1, STEPS + 1))  # one writer, no duplicates
    assert latest_checkpoint(run).name == f"step-{STEPS:06d}"

    one_losses = [x["loss"] for x in map(json.loads, (tmp_path / "one" / "metrics.jsonl").read_text().splitlines())
                  if "loss" in x]
    two_losses = [x["loss"] for x in lines if "loss" in x]
    assert two_losses == pytest.approx(one_losses, rel=1e-4, abs=1e-5)
    # evaluation is sharded across the processes and summed: the same figures as one process
    one_evals = [x["eval_loss"] for x in map(json.loads, (tmp_path / "one" / "metrics.jsonl").read_text()
                                                 .splitlines()) if "eval_loss" in x]
    two_evals = [x["eval_loss"] for x in lines if "eval_loss" in x]
    assert len(two_evals) == len(one_evals) == STEPS // 2
    assert two_evals == pytest.approx(one_evals, rel=1e-4)

    w1, w2 = read_weights(latest_checkpoint(tmp_path / "one")), read_weights(latest_checkpoint(run))
    assert w1.keys() == w2.keys()
    apart = max(float((w1[k].float() - w2[k].float()).abs().max()) for k in w1)
    assert apart < 1e-4, apart
    # while the last two steps alone moved them by far more (the comparison means something)
    half = read_weights(complete_checkpoints(tmp_path / "one")[0])
    assert max(float((half[k].float() - w1[k].float()).abs().max()) for k in w1) > 100 * max(apart, 1e-6)


def test_sharded_training_is_refused_in_one_line():
    from dataguard.train.errors import TrainError
    from dataguard.train.prepare import check_distributed_type

    for kind in ("DistributedType.FSDP", "DistributedType.DEEPSPEED", "MEGATRON_LM"):
        with pytest.raises(TrainError) as err:
            check_distributed_type(kind)
        assert "\n" not in str(err.value) and "not supported" in str(err.value)
    for kind in ("DistributedType.NO", "DistributedType.MULTI_GPU", "DistributedType.MULTI_CPU"):
        check_distributed_type(kind)  # DDP and a single process train
