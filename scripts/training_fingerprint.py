"""Fingerprints of two fixed-seed training runs, to prove a refactor changed no number.

Runs the sample alpaca rows (sft, the tiny causal LM) and the banking77 sample (classify, the
tiny classifier, logit adjustment and the long-tail curriculum) through a pipeline and 8
training steps each (one torch thread: a thread count changes float sums), then prints a hash of ``metrics.jsonl`` and ``events.jsonl`` (wall-clock
fields left out) and of every checkpoint weight file. Run it on two trees and diff:

    PYTHONPATH=/path/to/old python scripts/training_fingerprint.py /path/to/old > old.json
    python scripts/training_fingerprint.py . > new.json && diff old.json new.json
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

TIMING = ("time", "second", "elapsed", "per_s", "eta", "wall", "_s", "rss", "memory", "at")


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if not any(t in k for t in TIMING)}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def main(repo: Path) -> dict[str, Any]:
    sys.path.insert(0, str(repo))
    from dataguard.config import load_config
    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    work = Path(tempfile.mkdtemp(prefix="fingerprint-"))
    cases = [
        ("sft", f"inputs:\n  - {{path: {repo}/sample_data/alpaca_en_demo.json}}\n"
                "stages:\n  - length: {percentile: 90, factor: 1.0, action: truncate}\n",
         "tiny-causal-lm", {"max_length": 64}),
        ("classify", f"inputs:\n  - {{path: {repo}/sample_data/banking77/train.csv, format: labelled_text, "
                     "aliases: {category: label}}\n"
                     "stages:\n  - longtail: {tau: 1.0, phases: [0.5, 0.8], tail_boost: 2.0}\n",
         "tiny-classifier", {"max_length": 24, "logit_adjustment": True}),
    ]
    out: dict[str, Any] = {}
    for task, pipeline, model, extra in cases:
        (work / f"{task}.yaml").write_text(pipeline)
        cfg = load_config(work / f"{task}.yaml")
        cfg.pipeline(workers=1).run(cfg.inputs, work / f"{task}-data")
        run = work / f"{task}-run"
        Trainer(load_train_config({
            "task": task, "model": model, "data": str(work / f"{task}-data"), "output": str(run), "max_steps": 8,
            "batch_size": 4, "grad_accum": 2, "eval_every": 4, "save_every": 4, "tensorboard": False,
            "device": "cpu", "threads": 1, "seed": 3, "lr": 3e-3, **extra}), progress=False).fit()
        metrics = [_clean(json.loads(x)) for x in (run / "metrics.jsonl").read_text().splitlines()]
        events_file = run / "events.jsonl"
        events = [_clean(json.loads(x)) for x in events_file.read_text().splitlines()] if events_file.is_file() else []
        newest = sorted((run / "checkpoints").glob("step-*"))[-1]
        out[task] = {"metrics": _digest(metrics), "events": _digest(events), "last": metrics[-1],
                     "weights": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
                                 for p in sorted(newest.glob("*.safetensors"))}}
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()), indent=1, sort_keys=True))
