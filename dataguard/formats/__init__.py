"""Input templates: detect a raw record's template, map it to canonical turns, check it.

One module per template, each with ``detect``, ``map_record`` and, where a common plain
shape is worth it, a column-wise ``map_batch`` (``base.Template``); their docstrings say
the fields each reads. Auto-detection tries them in ``TEMPLATES`` order, by anchor fields:

* ``messages`` (``messages``), then ``sharegpt`` (``conversations``): turn lists,
  ``dataguard/formats/conversation.py``;
* ``alpaca`` (``instruction``, unless Dolly's fields without ``output``; a nested
  Self-Instruct record is ``unknown_format``), ``dolly`` (``instruction`` with ``context``
  or ``response``);
* ``prompt_completion`` (``prompt``; also TRL's ``prompt``/``chosen``/``rejected`` pairs);
* ``preference`` (``chosen`` and ``rejected`` as two whole conversations: Anthropic HH
  transcripts or TRL's implicit-prompt turn lists);
* ``labelled_text`` (a text field and a label field).

A forced format (``SourceOptions.format``) skips detection; its anchor field must be
present (``missing_field``). A record that is not a JSON object is ``not_an_object``
(except a ``[text, label]`` list under a forced ``labelled_text``); no template fits:
``unknown_format``. Field readers raise ``wrong_type``, ``missing_field``,
``missing_assistant``, ``unknown_role``, ``non_text_content``.

A record's ``label`` (string, integer or boolean, e.g. KTO's desirable flag) becomes the
``label`` column as a string (booleans as ``"true"``/``"false"``); an empty or blank string
is no label, not a class of its own. Fields that have no column go into ``meta``.

The checks every mapped record then passes, on either path, are ONE list:
``dataguard/formats/checks.py`` (``RECORD_CHECKS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataguard.formats import alpaca, dolly, labelled_text, messages, preference, prompt_completion, sharegpt
from dataguard.formats.base import Mapped, Reject, Template, TwoTurnRows
from dataguard.formats.checks import CHECK_REASONS, Context, check_record, passing_rows
from dataguard.io.raw import SourceOptions

# Auto-detection order.
TEMPLATES: tuple[Template, ...] = (messages.TEMPLATE, sharegpt.TEMPLATE, alpaca.TEMPLATE, dolly.TEMPLATE,
                                   prompt_completion.TEMPLATE, preference.TEMPLATE, labelled_text.TEMPLATE)
BY_NAME = {t.name: t for t in TEMPLATES}
FORMATS = ("alpaca", "sharegpt", "messages", "dolly", "prompt_completion", "preference", "labelled_text")

# Every reason code a template or a record check raises: code -> what it means.
REASONS = {
    "not_an_object": "the record is not a JSON object",
    "unknown_format": "no template fits the record's fields",
    "missing_field": "a forced format's anchor field is absent, or a labelled text's label is empty",
    "wrong_type": "a field or content of the wrong JSON type",
    "unknown_role": "a role name that maps to no canonical role",
    "non_text_content": "an image/audio content part",
    **preference.REASONS,
    **CHECK_REASONS,
}

__all__ = ["BY_NAME", "FORMATS", "REASONS", "TEMPLATES", "Context", "Mapped", "Reject", "Template", "TwoTurnRows",
           "check_record", "detect", "map_batch", "map_record", "passing_rows"]


def detect(rec: dict[str, Any], options: SourceOptions) -> Template:
    """The first template whose ``detect`` takes the record; ``unknown_format`` otherwise."""
    for template in TEMPLATES:
        if template.detect(rec, options):
            return template
    keys = ", ".join(sorted(rec)[:8]) or "none"
    raise Reject("unknown_format", f"no template fits the fields ({keys})")


def map_record(rec: Any, options: SourceOptions) -> Mapped:
    """One record -> ``Mapped`` (the per-record path), or ``Reject``."""
    forced = options.format
    if not isinstance(rec, dict):
        if forced == "labelled_text" and isinstance(rec, list | tuple):
            return labelled_text.map_record(rec, options)
        raise Reject("not_an_object", f"record is a {type(rec).__name__}, not a JSON object")
    template = detect(rec, options) if forced == "auto" else BY_NAME[forced]
    if template.anchor is not None and template.anchor not in rec:
        raise Reject("missing_field", f"format {template.name} needs field {template.anchor!r}")
    return template.map(rec, options)


def map_batch(records: Sequence[Any], errors: Sequence[str | None], options: SourceOptions,
              ctx: Context) -> list[TwoTurnRows]:
    """The batch path: rows of the batch that a template maps column-wise and that pass
    every record check, per template. Every other row takes ``map_record``."""
    candidates = TEMPLATES if options.format == "auto" else (BY_NAME[options.format],)
    out = []
    for batch_map in (t.map_batch for t in candidates):
        if batch_map is not None:
            rows = passing_rows(batch_map(records, errors, options), ctx)
            if rows.index:
                out.append(rows)
    return out
