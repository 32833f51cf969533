"""The stage contract every pipeline step follows.

Declared once per stage class: ``constraints`` (what each ``__init__`` keyword may be,
checked generically before ``__init__`` runs; see `dataguard.params`) and ``reasons`` (every
reason code ``apply`` may reject with, checked when rows are rejected).

Life of a stage in a run (see `dataguard.pipeline` and `dataguard.run.segment`):

0. ``prepare()`` - in the driver, once, before any unit: read what the stage needs from
   disk (a reference dataset). ``__init__`` does no I/O (config validation calls it).
1. ``score(batch)`` - row-local, adds measurement columns (token counts, ratios, ...).
   Runs fused with the previous row-local work, in worker processes.
2. ``summarize(batch)`` - only when ``needs_fit``: a small, picklable, mergeable summary of
   a scored batch (a histogram, class counts, a hash set). Runs in workers.
3. ``fit(summaries)`` - only when ``needs_fit``: merges all summaries (in input order, so
   results are deterministic) into the stage's state. Runs once in the driver.
4. ``apply(batch) -> Outcome`` - row-local decision: kept rows (with columns) and rejected
   rows with declared reasons, plus the batch's statistics as a `dataguard.tally.Tally`.
5. ``absorb(stats_list)`` - the driver hands back all batches' tallies in input order, once
   the segment that ran the stage's ``apply`` has finished; the base class merges them into
   ``self.tally`` (a stage overrides it only to derive state).
6. ``describe() -> dict`` - statistics and examples for the manifest and audit report.

Sharing a fit boundary (optional; the default is not to share). Fit stage A directly
followed by fit stage B costs two passes over the data (``..., score A, summarize A | fit A |
apply A, score B, summarize B | fit B | apply B, ...``) unless both declare what they touch:

* ``apply_adds()`` - None (the default): ``apply`` may reject rows or change existing columns.
  A set of names: with *this instance's parameters* ``apply`` keeps every row and writes
  only these columns (``set_column``: appended, or replaced in place); no other column changes.
* ``columns_read()`` - None (the default): unknown. A set of names: every column ``score``,
  ``summarize`` and ``apply`` read, or whose presence changes what they do (a reused
  ``prompt_embedding``, a weight column). A stage declaring it also lists every column its
  ``score`` and ``apply`` add in ``output_columns()``.

Then B joins A's boundary (``score A, summarize A, score B, summarize B | fit A, fit B |
apply A, apply B``) when A's ``apply_adds()`` and ``columns_read()`` and B's
``columns_read()`` are declared, B neither reads nor writes (``output_columns``) a column A's
apply adds, and A reads no column B adds (`dataguard.run.segment.can_share`; a third
stage C joins on the same terms against both). Only directly consecutive fit stages share:
a row-local stage between them closes the boundary. The output is byte-identical either way;
the runner checks that a shared apply kept every row and added no undeclared column (it
cannot check values: an apply that rewrites another column must return None).

A stage that needs no global statistics leaves ``needs_fit = False`` and only implements
``apply`` (and usually ``score``). The split mirrors scikit-learn's fit/transform and
data-juicer's compute-stats/process: scores stay as columns so users can re-threshold.

Fitting in rounds (optional, for stages whose fit would otherwise hold every row): a stage
whose ``fits_in_rounds()`` is True has ``summarize_unit(batch, files)`` write its per-unit
material to the work folder (`dataguard.rounds.tasks.UnitFitFiles`) and return a small
summary; the driver then calls ``fit_rounds(summaries, ctx)``, which runs rounds of tasks on
the executor (`dataguard.rounds`) and keeps only small state; ``apply_unit(batch, unit)``
reads the unit's answer back from the work folder. The output is the one ``fit`` gives.

``describe()`` returns plain JSON-able data in this shape, which the audit report renders
generically (a stage only chooses blocks; it never writes HTML)::

    {
      "title": "Length percentile truncation",
      "summary": {"cap": 812, "rows_truncated": 12, ...},       # key -> scalar
      "blocks": [
        {"type": "histogram", "title": ..., "edges": [..n+1..], "series": {"before": [..n..],
         "after": [..n..]}, "markers": [{"label": "cap", "value": 812}], "x_label": "tokens"},
        {"type": "bar", "title": ..., "labels": [...], "series": {"before": [...], ...}},
        {"type": "table", "title": ..., "columns": [...], "rows": [[...], ...]},
        {"type": "matrix", "title": ..., "row_labels": [...], "col_labels": [...],
         "values": [[...]], "row_title": "given", "col_title": "true"},
        {"type": "examples", "title": ..., "items": [{"id": ..., "label": ...,
         "text": ..., "spans": [[start, end], ...], "reference": ..., "note": ...}]},
        {"type": "text", "title": ..., "text": ...},
      ],
    }
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataguard.params import Allowed, Problem, first_problem
from dataguard.records import empty_rejected, reject_rows
from dataguard.tally import Tally

if TYPE_CHECKING:
    from dataguard.rounds.tasks import RoundContext, UnitFitFiles


@dataclass
class Outcome:
    """What ``Stage.apply`` returns: the rows kept, the rows rejected, and batch stats."""

    kept: pa.Table
    rejected: pa.Table = field(default_factory=empty_rejected)
    stats: Any = None


def drop_or_keep(table: pa.Table, mask: Any, *, action: str, stage: str, reason: str,
                 details: Callable[[], Sequence[str]], stats: Any = None) -> Outcome:
    """The usual ending of ``apply``: with ``action == "drop"`` the rows in ``mask`` (bool,
    one per row) move to ``rejected`` with ``reason`` and one detail each (``details`` is
    called only then); otherwise every row is kept (the stage's columns flag them)."""
    picked = np.asarray(mask, dtype=bool)
    if action != "drop" or not picked.any():
        return Outcome(kept=table, stats=stats)
    arr = pa.array(picked, pa.bool_())
    return Outcome(kept=table.filter(pc.invert(arr)), rejected=reject_rows(table, arr, stage, reason, list(details())),
                   stats=stats)


class StageConfigError(ValueError):
    """A stage was given a parameter it cannot use; the message names the parameter.

    ``param`` (optional) names the offending parameter explicitly, so a config error can
    point at that key's line instead of guessing it from the message; a constraint's
    `Problem` (``problem``) also says where inside the value it is (``names[2]``).
    """

    def __init__(self, message: str, param: str | None = None, problem: Problem | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.problem = problem


class StageDataError(ValueError):
    """A stage's parameters are valid but the data it was fitted on cannot be judged with them
    (a training run that saw none of these rows). Raised from ``fit``; the pipeline reports it
    as one line naming the stage, not as a dataguard bug."""


class UndeclaredReasonError(RuntimeError):
    """A stage rejected rows with a reason code it does not declare."""


class Stage:
    """Base class: override what your stage needs. Instances must be picklable."""

    name: ClassVar[str] = "stage"
    needs_fit: ClassVar[bool] = False
    # What each keyword argument may be (see `dataguard.params`); checked before __init__.
    constraints: ClassVar[dict[str, Allowed]] = {}
    # The reason codes this stage may reject rows with: code -> what it means (README table).
    reasons: ClassVar[dict[str, str]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Stage:
        problem = first_problem(cls.constraints, kwargs)
        if problem is not None:
            raise StageConfigError(str(problem), param=problem.path[0], problem=problem)
        # Remember the constructor's keyword arguments so a run started from Python can
        # record its configuration in the manifest exactly like a YAML run does.
        obj = super().__new__(cls)
        obj._params = dict(kwargs)
        obj.tally = Tally()
        return obj

    def params(self) -> dict[str, Any]:
        """The keyword arguments this stage was built with (only those given explicitly)."""
        return dict(getattr(self, "_params", {}))

    def effective_params(self) -> dict[str, Any]:
        """Every constructor parameter with the value in force: given, else its default.

        The manifest records these, so a run says what it did even where the config relied
        on defaults (which change between versions: `noise.features` did)."""
        import inspect

        given = self.params()
        out: dict[str, Any] = {}
        for name, p in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if name in given:
                out[name] = given[name]
            elif p.default is not p.empty:
                out[name] = p.default
        return out

    def prepare(self) -> None:
        """Read what the stage needs from disk (a reference dataset), once, in the driver,
        before any unit runs - never in ``__init__``, which config validation calls.
        Raise ``StageConfigError`` (naming the parameter) for a problem found here."""

    def score(self, batch: pa.Table) -> pa.Table:
        """Add measurement columns. Row-local; default adds nothing."""
        return batch

    def summarize(self, batch: pa.Table) -> Any:
        """Mergeable summary of a scored batch, for ``fit``. Only when ``needs_fit``."""
        raise NotImplementedError(f"stage {self.name!r} declares needs_fit but has no summarize()")

    def fit(self, summaries: Sequence[Any]) -> None:
        """Merge summaries (in input order) into state used by ``apply``."""
        raise NotImplementedError(f"stage {self.name!r} declares needs_fit but has no fit()")

    def apply(self, batch: pa.Table) -> Outcome:
        """Decide row by row. Default keeps everything."""
        return Outcome(kept=batch)

    def fits_in_rounds(self) -> bool:
        """True: ``summarize_unit`` / ``fit_rounds`` / ``apply_unit`` replace ``summarize`` /
        ``fit`` / ``apply`` in a pipeline run, so the driver never holds per-row material."""
        return False

    def summarize_unit(self, batch: pa.Table, files: UnitFitFiles) -> Any:
        """Write the unit's fit material under ``files``; return a small summary (counts)."""
        return self.summarize(batch)

    def fit_rounds(self, summaries: Sequence[Any], ctx: RoundContext) -> None:
        """Fit from the units' files by running rounds of tasks through ``ctx.run``."""
        self.fit(summaries)

    def apply_unit(self, batch: pa.Table, unit: int) -> Outcome:
        """``apply`` for unit ``unit`` (a stage fitted in rounds reads the unit's answer)."""
        return self.apply(batch)

    def absorb(self, stats: Sequence[Any]) -> None:
        """Receive every batch's ``Outcome.stats`` (in input order) in the driver: by default
        `Tally`s, merged into ``self.tally`` for ``describe``."""
        self.tally = Tally.merge(stats)

    def check_reasons(self, codes: Iterable[str]) -> None:
        """Refuse reason codes the stage does not declare in ``reasons`` (a programming
        error: the README table, the report and users' filters rely on the declared set)."""
        unknown = sorted(set(codes) - set(self.reasons))
        if unknown:
            raise UndeclaredReasonError(f"stage {self.name!r} rejected rows with reason(s) {unknown}, which its "
                                        f"`reasons` does not declare (declared: {sorted(self.reasons)})")

    def describe(self) -> dict[str, Any]:
        """Statistics and examples for the manifest and the audit report."""
        return {"title": self.name, "summary": {}, "blocks": []}

    def output_columns(self) -> dict[str, pa.DataType]:
        """Columns this stage adds (name -> type), used to keep shard schemas stable."""
        return {}

    def apply_adds(self) -> frozenset[str] | None:
        """With this instance's parameters, the only columns ``apply`` writes, when it keeps
        every row and changes no other column; None (the default) otherwise.
        Lets the next fit stage share this stage's fit boundary (see the module docstring)."""
        return None

    def columns_read(self) -> frozenset[str] | None:
        """Every column ``score``, ``summarize`` and ``apply`` read (or whose presence changes
        what they do); None (the default): unknown, so this stage shares no fit boundary."""
        return None

    def training_state(self) -> dict[str, Any] | None:
        """What the training runner needs from this stage (priors, offsets, caps), written to
        the manifest's ``training`` section under the stage's name; None: nothing."""
        return None

    def runs_read(self) -> list[str]:
        """The training run folders (or files in them) this stage reads rows' verdicts from;
        the pipeline refuses one trained on other files of the same names as its inputs
        (`dataguard.run.trained_inputs`)."""
        return []
