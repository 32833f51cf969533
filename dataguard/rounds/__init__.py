"""Distributed fit rounds: a global stage's fit as a few rounds of tasks the executor runs like units.

A stage that fits in rounds (``Stage.fits_in_rounds``) writes its per-unit material to the
work folder while it summarizes (`UnitFitFiles`), returns only a small per-unit summary
(counts), and its ``fit_rounds`` plans rounds of `RoundTask`s over those files (partitions
that depend on the data and the config only). Each task writes its output files, then a
marker naming them with their size and sha256 (`finish_task`); a resumed run skips a task
whose marker and files check out (`load_done`), as it skips a finished unit. The driver only
ever holds the tasks' small results. See ``dataguard.stages.near_dedup_rounds``.
"""
