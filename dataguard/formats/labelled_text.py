"""``labelled_text``: a text column (``text_field`` or ``text``) and a label column
(``label_field`` or the first of ``label``/``intent``/``category``) -> one user turn plus
``label``. When this format is forced, a 2-element list row ``[text, label]`` (CLINC150) is
accepted too. Labelled text has no assistant turn and is not checked for one."""

from __future__ import annotations

from typing import Any

from dataguard.formats.base import Mapped, Reject, Template, req_str, required_label, rest
from dataguard.io.raw import SourceOptions

LABEL_CANDIDATES = ("label", "intent", "category")


def label_field(rec: dict[str, Any], options: SourceOptions) -> str | None:
    if options.label_field:
        return options.label_field
    return next((k for k in LABEL_CANDIDATES if k in rec), None)


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    return (options.text_field or "text") in rec and label_field(rec, options) is not None


def map_record(rec: Any, options: SourceOptions) -> Mapped:
    if isinstance(rec, list | tuple):
        if len(rec) != 2:
            raise Reject("not_an_object", f"a list row must be [text, label], got {len(rec)} items")
        text, label = rec
        if not isinstance(text, str):
            raise Reject("wrong_type", f"text must be a string, got {type(text).__name__}")
        return Mapped("labelled_text", [("user", text)], required_label(label, "label"), {})
    text_field = options.text_field or "text"
    field = label_field(rec, options)
    text = req_str(rec, text_field, "missing_field")
    if field is None or rec.get(field) is None:
        raise Reject("missing_field", f"no label field ({options.label_field or ' / '.join(LABEL_CANDIDATES)})")
    return Mapped("labelled_text", [("user", text)], required_label(rec[field], field), rest(rec, {text_field, field}))


TEMPLATE = Template("labelled_text", None, detect, map_record)
