"""Scaffolding for tests, benchmarks and screenshots; never imported by the pipeline itself.

``runs`` real pipeline runs on ``sample_data/`` (and a scaled copy of one) for the report,
``browser`` a headless Chromium driver (DevTools over a pipe), ``plant`` benchmark items
planted into real training rows (contamination recall), ``noise`` seeded class-conditional
label noise (label-noise recall).
"""
