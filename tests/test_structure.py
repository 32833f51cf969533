"""Structure rules CONTRIBUTING.md states, enforced: no import cycles, small modules."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
HARD_MODULE_LINES = 600
MAX_CLASS_LINES = 200
HARD_CLASS_LINES = 250


def test_no_import_cycles_between_dataguard_modules() -> None:
    """Counts lazy imports inside functions and type-only imports too: hiding an import does not remove the circle."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "import_cycles.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 import cycle(s)" in done.stdout


def test_module_sizes() -> None:
    """Modules are split by job, not by line count: over MAX_MODULE_LINES is a warning to look
    at the module's jobs; over HARD_MODULE_LINES it surely has more than one and fails."""
    sizes = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
             for p in (REPO / "dataguard").rglob("*.py")}
    assert len(sizes) > 100  # the walk found the package
    _size_rule(sizes, MAX_MODULE_LINES, HARD_MODULE_LINES)


def _size_rule(sizes: dict[str, int], warn_over: int, fail_over: int) -> None:
    """The one ladder for modules and classes: over ``warn_over`` lines warns, over ``fail_over`` fails."""
    for where, n in sorted(sizes.items()):
        if n > warn_over:
            warnings.warn(f"{where}: {n} lines (over {warn_over}): does it hold more than one job?", stacklevel=2)
    assert {w: n for w, n in sizes.items() if n > fail_over} == {}


def test_class_sizes() -> None:
    """The same rule one level down (issue #25): a class over MAX_CLASS_LINES is a warning that it
    may hold two jobs; over HARD_CLASS_LINES it does and fails. Nested classes count on their own."""
    sizes: dict[str, int] = {}
    for path in (REPO / "dataguard").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                sizes[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 100  # the walk found the classes
    _size_rule(sizes, MAX_CLASS_LINES, HARD_CLASS_LINES)


def test_the_training_runner_loads_no_pipeline_stage() -> None:
    """`dataguard train` reads what a pipeline wrote; it never imports the stages (nor the pipeline
    config, which imports every stage), so the README's claim holds."""
    code = ("import sys, dataguard.cli_train, dataguard.train.loop, dataguard.train.convert, dataguard.train.report.page\n"
            "print([m for m in sys.modules if m.startswith('dataguard.stages') or m == 'dataguard.config'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
