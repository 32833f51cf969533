"""``alpaca``: ``instruction``, ``input``, ``output``, optional ``system`` and ``history``
[[query, answer], ...]. The user turn is instruction and input joined by "\\n"
(LLaMA-Factory's convention). LLaMA-Factory's preference shape puts ``chosen`` and
``rejected`` where ``output`` would be: the chosen response is the answer, the rejected one
goes to ``meta["rejected"]`` (the canonical pair, `dataguard.records`).

Most instruction data is plain ``{instruction, input, output}`` rows, and the per-record
path (detect, map, check: one Python call chain per row) costs ten times the work itself.
``map_batch`` maps those rows column-wise; anything unusual (other keys, wrong types, an
error row) is left to ``map_record``, which gives the exact reason code.
``tests/test_normalize_flat.py`` checks that both paths produce identical tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataguard.formats.base import (
    Mapped,
    Reject,
    Template,
    TwoTurnRows,
    join,
    label_str,
    opt_str,
    req_str,
    rest,
    system_turns,
)
from dataguard.formats.conversation import response_text
from dataguard.io.raw import SourceOptions

PLAIN_KEYS = frozenset({"instruction", "input", "output"})


def detect(rec: dict[str, Any], options: SourceOptions) -> bool:
    """``instruction`` without Dolly's fields (``dolly.detect``, next in line, takes those)."""
    if "instruction" not in rec:
        return False
    if "instances" in rec and "output" not in rec:
        raise Reject("unknown_format", "nested Self-Instruct record (instruction + instances): "
                     "flatten the instances into Alpaca rows first")
    return not (("response" in rec or "context" in rec) and "output" not in rec)


def map_record(rec: dict[str, Any], options: SourceOptions) -> Mapped:
    instruction = req_str(rec, "instruction", "missing_field")
    query = opt_str(rec, "input")
    meta: dict[str, Any] = {}
    if "output" not in rec and "chosen" in rec:  # LLaMA-Factory's alpaca preference pair
        output = response_text(rec["chosen"], "chosen")
        if output is None:
            raise Reject("missing_assistant", "field 'chosen' is null")
    else:
        output = req_str(rec, "output", "missing_assistant")
    if "rejected" in rec:
        meta["rejected"] = response_text(rec["rejected"], "rejected")
    turns = system_turns(rec)
    history = rec.get("history")
    if history is not None:
        if not isinstance(history, list):
            raise Reject("wrong_type", f"field 'history' must be a list of [query, answer], got {type(history).__name__}")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise Reject("wrong_type", f"history[{i}] must be a [query, answer] pair of strings")
            turns += [("user", pair[0]), ("assistant", pair[1])]
    turns += [("user", join(instruction, query)), ("assistant", output)]
    used = {"instruction", "input", "output", "chosen", "rejected", "system", "history", "label"}
    return Mapped("alpaca", turns, label_str(rec.get("label"), "label"), {**meta, **rest(rec, used)})


def map_batch(records: Sequence[Any], errors: Sequence[str | None], options: SourceOptions) -> TwoTurnRows:
    """The plain rows of a batch: a dict with only Alpaca keys, string instruction and output,
    string-or-absent input. Their turns are what ``map_record`` gives them."""
    # One pass over the (cache-cold) dicts pulls the three fields out together.
    rows = [(i, r.get("instruction"), r.get("input", ""), r.get("output"))
            for i, r in enumerate(records) if type(r) is dict and r.keys() <= PLAIN_KEYS and errors[i] is None]
    rows = [t for t in rows if type(t[1]) is str and type(t[3]) is str and type(t[2]) is str]
    # The user turn as ``join`` builds it: instruction and input joined by "\n", empty parts skipped.
    users = [(a + "\n" + b if b else a) if a else b for _, a, b, _ in rows]
    return TwoTurnRows("alpaca", [t[0] for t in rows], users, [t[3] for t in rows])


TEMPLATE = Template("alpaca", "instruction", detect, map_record, map_batch)
