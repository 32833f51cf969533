"""Label-noise estimation for the noise stage (`dataguard.stages.noise.stage`), one job per module.

``crossval`` out-of-fold probabilities (and refits on kept rows), ``knn`` neighbour votes,
``views`` which models make the probabilities (single view or the short-text ensemble),
``confident`` confident learning via cleanlab + the simple rules + the flag budget,
``rounds`` iterative re-estimation, ``probs`` logits / probability checks, ``params``
parameter validation, ``verdicts`` the fitted verdicts and apply's lookup by row id,
``report`` describe() and the fit report (seeded synthetic noise for tests and benchmarks: ``dataguard.testing.noise``).
"""
