"""The GPU check script's CPU path runs here (CI has no GPU): every variant trains, losses finite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_script_cpu_path_runs() -> None:
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "STEPS": "2", "PYTHONPATH": str(REPO),  # the script's `python`:
                               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "all runs finished with finite losses" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith(("tiny-causal-lm/", "minilm/"))]
    assert len(rows) == 12  # 2 models x 2 precisions x 3 variants
    assert "all model scenarios passed" in done.stdout  # scripts/gpu_check_model.py, tiny model on CPU
    for scenario in ("lora fp32", "full bf16", "gradient checkpointing", "packing", "resume mid-run",
                     "guard: poisoned state", "guard on vs off"):
        assert any(line.startswith(scenario) or scenario in line.split("  ")[0] for line in done.stdout.splitlines()), \
            scenario
    assert "rollbacks to steps [" in done.stdout and "every checkpoint finite and in bound: True" in done.stdout
