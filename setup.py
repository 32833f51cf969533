"""Build hook for the one compiled part: the repetition-score kernel.

Everything else is declared in pyproject.toml. The extension is optional: where no C
compiler exists the install still succeeds and dataguard falls back to the NumPy reference
implementation of the same scores (``dataguard.text.quality_scores``), only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dataguard.text._qscore",
            sources=["dataguard/text/_qscore.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-unused-function"],
            optional=True,
        )
    ]
)
