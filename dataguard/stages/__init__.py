"""Registry of stages by the name used in YAML configs.

Entries are import paths so that importing the registry stays cheap (no torch, no
sklearn) until a pipeline actually uses a stage.
"""

from __future__ import annotations

import importlib

from dataguard.stage import Stage

STAGE_PATHS: dict[str, str] = {
    "dedup": "dataguard.stages.dedup:DedupStage",
    "consistency": "dataguard.stages.consistency:ConsistencyStage",
    "length": "dataguard.stages.length:LengthStage",
    "quality": "dataguard.stages.quality:QualityStage",
    "overlap": "dataguard.stages.overlap:OverlapStage",
    "noise": "dataguard.stages.noise.stage:NoiseStage",
    "longtail": "dataguard.stages.longtail:LongTailStage",
    "drift": "dataguard.stages.drift:DriftStage",
    "language": "dataguard.stages.language:LanguageStage",
    "near_dedup": "dataguard.stages.near_dedup:NearDedupStage",
    "semantic_dedup": "dataguard.stages.semantic_dedup:SemanticDedupStage",
    "exclude": "dataguard.stages.exclude:ExcludeStage",
}


def stage_class(name: str) -> type[Stage]:
    """Import and return the stage class registered under ``name``."""
    if name not in STAGE_PATHS:
        raise KeyError(name)
    module_name, _, attr = STAGE_PATHS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)
