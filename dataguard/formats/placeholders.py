"""Unfilled template slots: the ``unfilled_placeholder`` check of normalization.

A slot is a *template-slot shape* around an identifier, nothing looser. The shapes
(``placeholder_styles`` of the normalizer; the default is ``[jinja, double_angle]``):

* ``jinja``: ``{{name}}`` / ``{{ user.name }}`` / ``{{ name | upper }}`` (Jinja / Mustache;
  spaces are allowed only as padding inside the double braces and around filters);
* ``double_angle``: ``<<name>>``, no space inside;
* opt-in, no space inside: ``brace`` ``{name}`` (``str.format`` / LangChain), ``angle``
  ``<name>``, ``square`` ``[name]``.

The identifier starts with a letter or ``_``, holds only letters, digits, ``_``, ``.`` and
``-``, and ends with a letter, digit or ``_``; the single-bracket shapes need at least two
characters (``{x}`` is a set, ``<T>`` a generic, ``[x]`` a checkbox). So ``<< impossible>>``
(a real 20 Newsgroups post quoting a word), ``a < b > c``, ``{}``, ``{1, 2}``, ``[1]`` and
``<<48/2=24>>`` (GSM8K calculator annotations) are text.

Why the single-bracket shapes are opt-in: on the real data in ``../shared/data`` (~318k text
fields) they hit ~440 more texts than the default, nearly all not slots (MMLU quotes with
editorial ``[Later]``, Python f-strings outside code fences ``{msg.topic}``, math ``{x_n}``,
``<numerator>/<denominator>`` in HumanEval docstrings, 20 Newsgroups ``[rw]``), against a
handful of real ones (``[Recipient]`` letters). Turn them on for data whose templates use
them.

Never slots, whatever the styles:

* anything inside Markdown code (fenced blocks and inline backticks): a Jinja/Vue answer may
  legitimately contain ``{{ x }}``, a JSON snippet ``{"a": {b}}``, a C ``#include <stdio.h>``;
* a bracket directly after a letter, digit, ``_`` or (for braces) ``}``, ``\\``, ``$``, ``^``,
  ``#``, ``%``: ``List<T>``, ``a[i]``, LaTeX ``\\frac{{a}}{b}``, ``x^{n}``,
  ``${{ github.repository }}`` (GitHub Actions), shell ``${HOME}``, Ruby ``#{name}``;
* HTML/XML markup: ``<br>``, ``<div>`` and every other HTML element name, and any ``<tag>``
  whose closing ``</tag>`` is in the same text (``<tool_call>...</tool_call>``, ``<think>``);
* model special tokens: ``<s>``, ``<unk>``, ``<<SYS>>``, ``[INST]``, ``[CLS]``, ``[MASK]``...;
* Markdown links and references ``[text](url)``, ``[text][ref]``, ``[ref]: url``; ``[sic]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")

_ID = r"[^\W\d](?:[\w.\-]*\w)?"  # letter/_ first, then letters, digits, _ . -; no trailing . or -
_ID2 = r"[^\W\d][\w.\-]*\w"  # the same, at least two characters (single-bracket shapes)
STYLE_PATTERNS: dict[str, str] = {
    "jinja": r"(?P<jinja>(?<![\\\w}$^#%]){{\s*" + _ID + r"(?:\s*\|\s*[\w.\-]+)*\s*}})",
    "double_angle": r"(?P<angle2>(?<![<\w])<<(?P<name2>" + _ID + r")>>(?!>))",
    "brace": r"(?P<brace>(?<![\\\w{}$^#%])\{" + _ID2 + r"\}(?!}))",
    "angle": r"(?P<angle>(?<![<\w])<(?P<name1>" + _ID2 + r")>(?!>))",
    "square": r"(?P<square>(?<![\[\]\w])\[(?P<word>" + _ID2 + r")\](?![\[(:]))",
}
STYLES = tuple(STYLE_PATTERNS)
DEFAULT_STYLES = ("jinja", "double_angle")

HTML_ELEMENTS = frozenset("""
a abbr address area article aside audio b base bdi bdo blockquote body br button canvas caption cite
code col colgroup data datalist dd del details dfn dialog div dl dt em embed fieldset figcaption figure
footer form h1 h2 h3 h4 h5 h6 head header hgroup hr html i iframe img input ins kbd label legend li link
main map mark menu meta meter nav noscript object ol optgroup option output p param picture pre progress
q rp rt ruby s samp script search section select slot small source span strong style sub summary sup
table tbody td template textarea tfoot th thead time title tr track u ul var video wbr center font big
strike tt frame frameset noframes marquee blink nobr svg path g circle rect line polyline polygon math
""".split())
SPECIAL_TOKENS = frozenset("s unk pad bos eos sep cls mask sys inst endoftext im_start im_end eot_id".split())
EDITORIAL = frozenset({"sic"})


def placeholder_styles(value: Iterable[str] | None) -> tuple[str, ...]:
    """The styles in canonical order (the normalizer's constraints checked the names)."""
    if value is None:
        return DEFAULT_STYLES
    given = list(value)
    return tuple(s for s in STYLES if s in given)


@lru_cache(maxsize=32)
def _slot_pattern(styles: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(STYLE_PATTERNS[s] for s in styles))


def find_placeholders(text: str, styles: tuple[str, ...] = DEFAULT_STYLES) -> list[str]:
    """Unfilled template slots in ``text`` (see the module docstring for the rule)."""
    if styles == DEFAULT_STYLES:  # the hot per-record path: two memchr-backed tests
        if not (("{" in text and "{{" in text) or ("<" in text and "<<" in text)):
            return []
    elif not ("{" in text or "<" in text or "[" in text):
        return []
    if "`" in text:
        text = _INLINE_CODE.sub(" ", _CODE_FENCE.sub(" ", text))
    found: list[str] = []
    for m in _slot_pattern(styles).finditer(text):
        groups = m.groupdict()
        name = groups.get("name1") or groups.get("name2")
        if name is not None and not _is_angle_slot(name, text):
            continue
        word = groups.get("word")
        if word is not None and (word.lower() in SPECIAL_TOKENS or word.lower() in EDITORIAL):
            continue
        found.append(m.group(0))
    return found


def may_hold_placeholder(text: str, styles: tuple[str, ...] = DEFAULT_STYLES) -> bool:
    """Cheap pre-test of the batch fast path: False only when ``find_placeholders(text,
    styles)`` is certainly empty, so a row it clears is decided as the per-record path would.

    For the default styles this is "{{" or "<<" in the text; the one-character tests run as
    memchr (``"{{" in text`` alone is ~15x slower in CPython)."""
    if styles == DEFAULT_STYLES:
        return ("{" in text and "{{" in text) or ("<" in text and "<<" in text)
    if not ("{" in text or "<" in text or "[" in text):
        return False
    # Without a backtick, find_placeholders runs this very pattern on this very text; with
    # one, removing code could change a neighbour, so the exact path decides.
    return "`" in text or _slot_pattern(styles).search(text) is not None


def _is_angle_slot(name: str, text: str) -> bool:
    """``<name>`` / ``<<name>>``: a slot unless HTML, a special token or closed in the text."""
    low = name.lower()
    if low in HTML_ELEMENTS or low in SPECIAL_TOKENS:
        return False
    return f"</{name}>" not in text
