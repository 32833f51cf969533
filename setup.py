"""Build hook for the compiled parts: the repetition-score kernel and the JSON scanner.

Everything else is declared in pyproject.toml. The kernel is the only implementation of the
repetition / URL scores, so it is required: where it cannot be compiled the install stops
with a message that names what to install (a C compiler and the Python headers). The JSON
scanner speeds up reading JSON arrays; its NumPy twin in dataguard/io/json_structure.py is
used where it is missing.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NEEDS_COMPILER = """dataguard could not compile its kernels (dataguard/text/_qscore.c, dataguard/io/_jsonscan.c).
It needs a C compiler and the Python development headers. Install them, then install dataguard again:
  Debian / Ubuntu:  apt install gcc python3-dev
  Fedora / RHEL:    dnf install gcc python3-devel
  Alpine:           apk add gcc musl-dev python3-dev
  macOS:            xcode-select --install
  Windows:          Microsoft C++ Build Tools (https://visualstudio.microsoft.com/visual-cpp-build-tools/)
  conda:            conda install -c conda-forge c-compiler
Cause: {cause}"""


class BuildKernel(build_ext):
    """build_ext that turns a missing compiler or header into one clear message."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as err:
            raise SystemExit("error: " + NEEDS_COMPILER.format(cause=err)) from err


setup(
    ext_modules=[
        Extension(
            "dataguard.text._qscore",
            sources=["dataguard/text/_qscore.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-unused-function"],
        ),
        Extension(
            "dataguard.io._jsonscan",
            sources=["dataguard/io/_jsonscan.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall"],
        ),
    ],
    cmdclass={"build_ext": BuildKernel},
)
