"""The record checks of normalization: ONE list, ``RECORD_CHECKS``, run by both paths.

The per-record path runs each check's ``row`` function on the mapped record, in list order;
the first failure is the row's reason. The batch path (rows a template's ``map_batch``
mapped column-wise to ``[user, assistant]``) runs each check's ``batch`` function, which
names the rows that may fail (a cheap over-approximation is fine: those rows take the
per-record path, which gives the exact reason); a check without a ``batch`` form is run row
by row there too. So a check added to the list applies to every row, whichever path it
takes.

Reason codes raised here:

* ``disallowed_role``: a turn whose role is not in ``allowed_roles``.
* ``empty_prompt``: a labelled text that is empty; a conversation in which no user turn
  has any text.
* ``missing_assistant``: no assistant turn, or the conversation ends with a user/tool turn
  that has no answer (nothing to train on for that turn).
* ``bad_role_order``: a system turn after the conversation started, a first non-system
  turn that is not from the user, or a tool turn that does not follow an assistant (call)
  or tool turn. Two user turns in a row are allowed (people send two messages), and so are
  two assistant turns (a reply, then a call): chat templates that need strict alternation
  can merge them, and rejecting them would lose real data.
* ``empty_assistant``: an assistant turn that is empty or whitespace.
* ``unfilled_placeholder``: a template slot left in the text (``dataguard/formats/placeholders.py``).
* ``empty_rejected`` / ``identical_pair``: a preference pair (a ``rejected`` response beside
  the chosen final assistant turn) whose rejected response is empty, or the same as the
  chosen one after whitespace normalisation: it states no preference, and preference
  training on it would push a response away from itself.

Not record checks: ``invalid_unicode`` (a lone surrogate, which cannot be written as UTF-8)
and ``too_deep`` are found when the row is written (``dataguard/stages/normalize.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from dataguard.formats.base import Mapped, Reject, TwoTurnRows
from dataguard.formats.placeholders import DEFAULT_STYLES, find_placeholders, may_hold_placeholder

UNANSWERED_FORMATS = frozenset({"labelled_text"})  # records with no assistant turn by design

CHECK_REASONS = {
    "disallowed_role": "a turn whose role is not in allowed_roles",
    "empty_prompt": "no user turn (or labelled text) has any text",
    "missing_assistant": "no assistant turn, or the last user/tool turn has no answer",
    "bad_role_order": "a late system turn, a first turn not from the user, or a tool turn after no call",
    "empty_assistant": "an assistant turn that is empty or whitespace",
    "unfilled_placeholder": "a template slot ({{name}}, <<name>>, ...) left in the text",
    "empty_rejected": "a preference pair whose rejected response is empty",
    "identical_pair": "a preference pair whose rejected response equals the chosen one (whitespace aside)",
}


@dataclass(frozen=True)
class Context:
    """The normalizer's settings the checks read."""

    allowed: frozenset[str]  # allowed roles
    styles: tuple[str, ...] | None  # placeholder styles checked; None: placeholders are not checked


@dataclass(frozen=True)
class Check:
    """``row`` raises ``Reject`` with one of ``reasons`` (codes of ``CHECK_REASONS``) for a
    failing record; ``batch``, optional, returns the positions (into the rows) of every row
    that may fail. ``answered``: None applies the check to every record, True only to
    conversations (records with an assistant turn), False only to the others (labelled text)."""

    name: str
    reasons: tuple[str, ...]
    row: Callable[[Mapped, Context], None]
    batch: Callable[[TwoTurnRows, Context], Iterable[int]] | None = None
    answered: bool | None = None

    def applies(self, fmt: str) -> bool:
        return self.answered is None or self.answered == (fmt not in UNANSWERED_FORMATS)


def _allowed_roles(mapped: Mapped, ctx: Context) -> None:
    allowed = ctx.allowed
    for i, (role, _) in enumerate(mapped.turns):
        if role not in allowed:
            raise Reject("disallowed_role", f"turn {i} has role {role!r} (allowed: {', '.join(sorted(allowed))})")


def _allowed_roles_batch(rows: TwoTurnRows, ctx: Context) -> Iterable[int]:
    return () if {"user", "assistant"} <= ctx.allowed else range(len(rows))


def _text_present(mapped: Mapped, ctx: Context) -> None:
    if not mapped.turns[0][1].strip():
        raise Reject("empty_prompt", "the text is empty")


def _turn_order(mapped: Mapped, ctx: Context) -> None:
    roles = [r for r, _ in mapped.turns]
    if "assistant" not in roles:
        raise Reject("missing_assistant", f"no assistant turn among {len(roles)} turns")
    started = False
    for i, role in enumerate(roles):
        if role == "system":
            if started:
                raise Reject("bad_role_order", f"system turn at position {i} after the conversation started")
            continue
        if not started and role != "user":
            raise Reject("bad_role_order", f"first non-system turn (position {i}) is {role}, not user")
        started = True
        if role == "tool" and roles[i - 1] not in ("assistant", "tool"):
            raise Reject("bad_role_order", f"tool turn at position {i} follows {roles[i - 1]}, not a call")
    if roles[-1] != "assistant":
        raise Reject("missing_assistant", f"conversation ends with a {roles[-1]} turn that has no answer")


def _turn_order_batch(rows: TwoTurnRows, ctx: Context) -> Iterable[int]:
    return ()  # [user, assistant] is in order


def _turn_text(mapped: Mapped, ctx: Context) -> None:
    turns = mapped.turns
    for i, (role, text) in enumerate(turns):
        if role == "assistant" and not text.strip():
            raise Reject("empty_assistant", f"assistant turn at position {i} is empty")
    if not any(text.strip() for role, text in turns if role == "user"):
        raise Reject("empty_prompt", "no user turn has any text")


def _turn_text_batch(rows: TwoTurnRows, ctx: Context) -> Iterable[int]:
    if all(map(str.strip, rows.assistant)) and all(map(str.strip, rows.user)):  # the common case, at C speed
        return ()
    return ([j for j, a in enumerate(rows.assistant) if not a.strip()]
            + [j for j, u in enumerate(rows.user) if not u.strip()])


def _placeholders(mapped: Mapped, ctx: Context) -> None:
    styles = ctx.styles
    if styles is None:
        return
    for i, (role, text) in enumerate(mapped.turns):
        slots = find_placeholders(text, styles)
        if slots:
            shown = ", ".join(sorted(set(slots))[:5])
            raise Reject("unfilled_placeholder", f"{role} turn {i} has unfilled template slots: {shown}")


def _placeholders_batch(rows: TwoTurnRows, ctx: Context) -> Iterable[int]:
    """Rows that may hold a slot (for the default styles: "{{" or "<<" in a turn); the
    per-record path knows about code blocks, identifiers and GSM8K annotations."""
    if ctx.styles is None:
        return ()
    may = may_hold_placeholder if ctx.styles == DEFAULT_STYLES else partial(may_hold_placeholder, styles=ctx.styles)
    return [j for j, u in enumerate(rows.user) if may(u)] + [j for j, a in enumerate(rows.assistant) if may(a)]


def _preference_pair(mapped: Mapped, ctx: Context) -> None:
    if "rejected" not in mapped.meta or not mapped.turns:
        return
    rejected = mapped.meta["rejected"]  # text or None: the templates map every response shape to text
    if rejected is None or (isinstance(rejected, str) and not rejected.strip()):
        raise Reject("empty_rejected", "the pair's rejected response is empty")
    if isinstance(rejected, str) and " ".join(rejected.split()) == " ".join(mapped.turns[-1][1].split()):
        raise Reject("identical_pair", "the rejected response is the chosen one")


def _preference_pair_batch(rows: TwoTurnRows, ctx: Context) -> Iterable[int]:
    return ()  # batch-mapped rows have no meta, so no rejected response


RECORD_CHECKS: list[Check] = [
    Check("allowed_roles", ("disallowed_role",), _allowed_roles, _allowed_roles_batch),
    Check("text_present", ("empty_prompt",), _text_present, answered=False),
    Check("turn_order", ("missing_assistant", "bad_role_order"), _turn_order, _turn_order_batch, answered=True),
    Check("turn_text", ("empty_assistant", "empty_prompt"), _turn_text, _turn_text_batch, answered=True),
    Check("placeholders", ("unfilled_placeholder",), _placeholders, _placeholders_batch),
    Check("preference_pair", ("empty_rejected", "identical_pair"), _preference_pair, _preference_pair_batch,
          answered=True),
]


def check_record(mapped: Mapped, ctx: Context) -> None:
    """Run every check on one mapped record; raises ``Reject`` on the first failure."""
    answered = mapped.fmt not in UNANSWERED_FORMATS
    for check in RECORD_CHECKS:
        if check.answered is None or check.answered == answered:  # check.applies, inlined: the hot path
            check.row(mapped, ctx)


def passing_rows(rows: TwoTurnRows, ctx: Context) -> TwoTurnRows:
    """The rows that certainly pass every check (the others go to the per-record path)."""
    if not rows.index:
        return rows
    failing: set[int] = set()
    for check in RECORD_CHECKS:
        if not check.applies(rows.fmt):
            continue
        if check.batch is not None:
            failing.update(check.batch(rows, ctx))
        else:
            failing.update(j for j in range(len(rows)) if _fails(check, rows.mapped(j), ctx))
    if not failing:
        return rows
    return rows.keep([j for j in range(len(rows)) if j not in failing])


def _fails(check: Check, mapped: Mapped, ctx: Context) -> bool:
    try:
        check.row(mapped, ctx)
    except Reject:
        return True
    return False
