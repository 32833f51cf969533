"""Repetition / URL quality filter, scored separately on the prompt and the response side.

Prompt side = system + user + tool turns, response side = assistant turns (joined with
newlines, as in ``dataguard.records``). ``score`` adds, per side, float32 columns
``{side}_{score}`` (see ``dataguard.text.repetition_kernel`` for the exact definitions);
``apply`` rejects a row at its first failing rule (reason code below) and lists every
failure in ``detail``. Each threshold can be set to ``None`` to disable its rule.

Defaults and where they come from:

=====================  ==========================  ==========  =====================================
rule (reason code)     score                       reject if   source of the default
=====================  ==========================  ==========  =====================================
char_repeat            char_repeat_ratio           >= 0.3      dataguard issue #3 (share of chars
                                                               equal to the previous one)
too_many_urls          url_count                   >= 3        dataguard issue #3
url_ratio              url_char_ratio              >= 0.5      ours (an answer that is mostly links)
special_characters     special_char_ratio          > max       data-juicer special_characters_filter
                                                   (off)       (its 0.25 rejects most code answers)
char_ngram_repetition  char_rep_ratio (rep_len 10) > 0.5       data-juicer character_repetition_filter
word_ngram_repetition  word_rep_ratio (rep_len 10) > 0.5       data-juicer word_repetition_filter
duplicate_lines        dup_line_frac               > 0.3       Gopher, Rae et al. 2021, Table A1
duplicate_line_chars   dup_line_char_frac          > 0.2       Gopher Table A1
gopher_top_ngram       top{2,3,4}_gram_char_frac   > .20/.18/.16  Gopher Table A1
gopher_dup_ngram       dup{5..10}_gram_char_frac   > .15 ... .10  Gopher Table A1
=====================  ==========================  ==========  =====================================

The Gopher rules were designed for web documents of at least 50 words (Gopher's own
minimum); on a 6-word prompt one repeated bigram is already "20% of the characters". They
therefore apply only to texts with at least ``gopher_min_words`` words (default 50); the
scores are still computed for every row.

A side longer than ``max_text_bytes`` UTF-8 bytes (default 8 MiB, the readers' record
limit) is not scored - scoring needs ~100 bytes of memory per character - and neither is one
that alone runs out of memory: its score columns are null and the row is rejected as
``text_too_long`` before any other rule (that reason appears in the report only when used).

Preference pairs: the rejected response is scored and judged too, and a pair whose chosen
response alone fails is ``chosen_fails_quality`` (`dataguard.stages.quality_pairs`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.params import FLAG, Interval, ListOf, MapOf, Options, Satisfies
from dataguard.records import reject_rows
from dataguard.stage import Outcome, Stage, StageConfigError
from dataguard.stages.quality_pairs import MEANING as PAIR_MEANING
from dataguard.stages.quality_pairs import REASON as PAIR_REASON
from dataguard.stages.quality_pairs import judge_pairs, score_rejected
from dataguard.stages.quality_report import describe_quality, reject_examples, reject_unscored
from dataguard.stages.quality_rules import (
    DUP_DEFAULT,
    HIST_EDGES,
    HIST_SCORES,
    MAX_EXAMPLES,
    MAX_TEXT_BYTES_DEFAULT,
    REASONS,
    SIDES,
    TOP_DEFAULT,
)
from dataguard.tally import Tally
from dataguard.text.message_pieces import message_pieces
from dataguard.text.repetition_kernel import (
    MAX_NGRAM,
    MAX_REP_LEN,
    MAX_TEXT_BYTES,
    ScoreSpec,
    TextScorer,
    score_segments,
    score_strings,
)


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _ngram_size(k: object) -> int | None:
    """An n-gram size given as an integer or an integer string (YAML keys may be either)."""
    if _is_int(k) or (isinstance(k, float) and k.is_integer()):
        return int(k)  # type: ignore[call-overload]
    if isinstance(k, str) and k.strip().lstrip("+-").isdigit():
        return int(k)
    return None


class QualityStage(Stage):
    """Repetition and URL filter (see module docstring for rules, defaults and sources)."""

    name = "quality"
    needs_fit = False
    constraints = {
        "sides": [ListOf(Options(*SIDES), min_len=1, unique=True)],
        **{name: [Interval(float, 0, 1), None] for name in (
            "char_repeat_threshold", "url_ratio_threshold", "special_char_max", "char_rep_max", "word_rep_max",
            "dup_line_frac_max", "dup_line_char_frac_max")},
        "ignore_whitespace_repeats": FLAG,
        "url_count_threshold": [Interval(int, 1), None],
        "char_rep_len": [Interval(int, 1, MAX_REP_LEN)],
        "word_rep_len": [Interval(int, 1, MAX_REP_LEN)],
        "top_ngram_max": [MapOf(Satisfies(lambda k: _ngram_size(k) is not None, "an n-gram size"),
                                Interval(float, 0, 1)), None],
        "dup_ngram_max": [MapOf(Satisfies(lambda k: _ngram_size(k) is not None, "an n-gram size"),
                                Interval(float, 0, 1)), None],
        "gopher_min_words": [Interval(int, 0)],
        "max_text_bytes": [Interval(int, 1, MAX_TEXT_BYTES)],
    }
    reasons = {**REASONS, PAIR_REASON: PAIR_MEANING}

    def __init__(self, *, sides: Sequence[str] = ("prompt", "response"),
                 char_repeat_threshold: float | None = 0.3, ignore_whitespace_repeats: bool = True,
                 url_count_threshold: int | None = 3, url_ratio_threshold: float | None = 0.5,
                 special_char_max: float | None = None,
                 char_rep_max: float | None = 0.5, char_rep_len: int = 10,
                 word_rep_max: float | None = 0.5, word_rep_len: int = 10,
                 dup_line_frac_max: float | None = 0.3, dup_line_char_frac_max: float | None = 0.2,
                 top_ngram_max: Mapping[int, float] | None = None,
                 dup_ngram_max: Mapping[int, float] | None = None,
                 gopher_min_words: int = 50, max_text_bytes: int = MAX_TEXT_BYTES_DEFAULT) -> None:
        sides = tuple(sides)
        self.sides = sides
        self.char_repeat_threshold = char_repeat_threshold
        self.ignore_whitespace_repeats = ignore_whitespace_repeats
        self.url_count_threshold = url_count_threshold
        self.url_ratio_threshold = url_ratio_threshold
        self.special_char_max = special_char_max
        self.char_rep_max = char_rep_max
        self.char_rep_len = char_rep_len
        self.word_rep_max = word_rep_max
        self.word_rep_len = word_rep_len
        self.dup_line_frac_max = dup_line_frac_max
        self.dup_line_char_frac_max = dup_line_char_frac_max
        self.top_ngram_max = self._ngram_map("top_ngram_max", top_ngram_max, TOP_DEFAULT, 2)
        self.dup_ngram_max = self._ngram_map("dup_ngram_max", dup_ngram_max, DUP_DEFAULT, 2)
        self.gopher_min_words = gopher_min_words
        self.max_text_bytes = max_text_bytes

    @staticmethod
    def _ngram_map(pname: str, value: Mapping[Any, Any] | None, default: dict[int, float],
                   min_n: int) -> dict[int, float]:
        if value is None:
            return dict(default)
        out: dict[int, float] = {}
        for k, v in value.items():
            n = _ngram_size(k)
            if n is None or n < min_n or n > MAX_NGRAM:
                raise StageConfigError(f"{pname}: n-gram size {k!r} must be between {min_n} and {MAX_NGRAM}",
                                       param=pname)
            if n in out:
                raise StageConfigError(f"{pname}: n-gram size {n} is given twice", param=pname)
            out[n] = float(v)
        return dict(sorted(out.items()))

    # -- columns ---------------------------------------------------------------------------
    def _score_names(self) -> list[tuple[str, pa.DataType]]:
        names: list[tuple[str, pa.DataType]] = [
            ("char_repeat_ratio", pa.float32()), ("url_count", pa.int32()), ("url_char_ratio", pa.float32()),
            ("special_char_ratio", pa.float32()), ("char_rep_ratio", pa.float32()), ("word_rep_ratio", pa.float32()),
            ("dup_line_frac", pa.float32()), ("dup_line_char_frac", pa.float32()), ("gopher_words", pa.int32()),
        ]
        names += [(f"top{k}_gram_char_frac", pa.float32()) for k in self.top_ngram_max]
        names += [(f"dup{k}_gram_char_frac", pa.float32()) for k in self.dup_ngram_max]
        return names

    def output_columns(self) -> dict[str, pa.DataType]:
        return {f"{side}_{name}": t for side in self.sides for name, t in self._score_names()}

    # -- score -----------------------------------------------------------------------------
    @property
    def score_spec(self) -> ScoreSpec:
        return ScoreSpec(ignore_whitespace=self.ignore_whitespace_repeats, char_rep_len=self.char_rep_len,
                         word_rep_len=self.word_rep_len, top_ns=tuple(self.top_ngram_max),
                         dup_ns=tuple(self.dup_ngram_max))

    def side_scores(self, texts: pa.Array | Sequence[str], scorer: TextScorer | None = None) -> dict[str, np.ndarray]:
        """Every score of one side's texts (by the compiled kernel, or ``scorer``: the tests'
        reference); NaN for texts over ``max_text_bytes``."""
        return score_strings(texts, self.score_spec, max_text_bytes=self.max_text_bytes, scorer=scorer)

    def score(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        pieces = message_pieces(batch)
        if pieces is None:
            scores = self.side_scores(pa.array([], pa.string()))
            per_side = dict.fromkeys(self.sides, scores)
        else:
            # One kernel call scores every side: side j's texts are rows j*n .. (j+1)*n.
            segments, groups = [], [np.zeros(1, dtype=np.int64)]
            for side in self.sides:
                _, seg, grp = pieces.side(SIDES[side])
                groups.append(grp[1:] + sum(len(x) for x in segments))
                segments.append(seg)
            scores = score_segments(pieces.content, np.concatenate(segments), np.concatenate(groups),
                                    self.score_spec, max_text_bytes=self.max_text_bytes)
            per_side = {side: {k: v[j * n:(j + 1) * n] for k, v in scores.items()}
                        for j, side in enumerate(self.sides)}
        # Add (or replace) every score column in one table build.
        fields, columns = list(batch.schema), list(batch.columns)
        where = {f.name: i for i, f in enumerate(fields)}
        for side in self.sides:
            unscored = np.isnan(per_side[side]["char_repeat_ratio"])  # NaN only where not scored
            mask = unscored if unscored.any() else None
            for name, typ in self._score_names():
                col = f"{side}_{name}"
                arr = pa.array(per_side[side][name].astype(typ.to_pandas_dtype(), copy=False), typ, mask=mask)
                if col in where:
                    fields[where[col]], columns[where[col]] = pa.field(col, typ), arr
                else:
                    fields.append(pa.field(col, typ))
                    columns.append(arr)
        table = pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=batch.schema.metadata))
        return score_rejected(self, table)

    # -- apply -----------------------------------------------------------------------------
    def _rules(self) -> list[tuple[str, str, float, str, bool]]:
        """(reason, score, threshold, comparison, gopher-gated) in the order they are checked."""
        rules: list[tuple[str, str, float, str, bool]] = []
        if self.char_repeat_threshold is not None:
            rules.append(("char_repeat", "char_repeat_ratio", self.char_repeat_threshold, ">=", False))
        if self.url_count_threshold is not None:
            rules.append(("too_many_urls", "url_count", self.url_count_threshold, ">=", False))
        if self.url_ratio_threshold is not None:
            rules.append(("url_ratio", "url_char_ratio", self.url_ratio_threshold, ">=", False))
        if self.special_char_max is not None:
            rules.append(("special_characters", "special_char_ratio", self.special_char_max, ">", False))
        if self.char_rep_max is not None:
            rules.append(("char_ngram_repetition", "char_rep_ratio", self.char_rep_max, ">", False))
        if self.word_rep_max is not None:
            rules.append(("word_ngram_repetition", "word_rep_ratio", self.word_rep_max, ">", False))
        if self.dup_line_frac_max is not None:
            rules.append(("duplicate_lines", "dup_line_frac", self.dup_line_frac_max, ">", True))
        if self.dup_line_char_frac_max is not None:
            rules.append(("duplicate_line_chars", "dup_line_char_frac", self.dup_line_char_frac_max, ">", True))
        rules += [("gopher_top_ngram", f"top{k}_gram_char_frac", v, ">", True) for k, v in self.top_ngram_max.items()]
        rules += [("gopher_dup_ngram", f"dup{k}_gram_char_frac", v, ">", True) for k, v in self.dup_ngram_max.items()]
        return rules

    def apply(self, batch: pa.Table) -> Outcome:
        if any(c not in batch.column_names for c in self.output_columns()):
            batch = self.score(batch)
        n = batch.num_rows
        first_reason: list[str | None] = [None] * n
        details: list[list[str]] = [[] for _ in range(n)]
        # counters: "rejected" (by first failing rule), "failures" (every failing rule)
        stats = Tally(counts=Counter(rows_in=n))
        reject_unscored(batch, self.sides, self.max_text_bytes, first_reason, details, stats)
        for side in self.sides:
            words = batch.column(f"{side}_gopher_words").to_numpy(zero_copy_only=False)
            gate = words >= self.gopher_min_words
            for reason, score, thr, op, gated in self._rules():
                vals = batch.column(f"{side}_{score}").to_numpy(zero_copy_only=False)
                fail = (vals >= thr) if op == ">=" else (vals > thr)
                if gated:
                    fail &= gate
                failing = np.flatnonzero(fail).tolist()
                stats.count("failures", {reason: len(failing)})
                for i in failing:
                    v = vals[i]
                    shown = f"{int(v)}" if score == "url_count" else f"{float(v):.3f}"
                    details[i].append(f"{side} {score}={shown} {op} {thr:g}")
                    if first_reason[i] is None:
                        first_reason[i] = reason
            for name in HIST_SCORES:
                col = f"{side}_{name}"
                if col in batch.column_names:
                    h, _ = np.histogram(np.clip(batch.column(col).to_numpy(zero_copy_only=False), 0, 1), HIST_EDGES)
                    stats.hist(col, h.astype(np.int64))
        judge_pairs(self, batch, first_reason, details, stats)
        mask = np.array([r is not None for r in first_reason], dtype=bool)
        idx = np.flatnonzero(mask).tolist()
        rejected = reject_rows(batch, mask, self.name, [first_reason[i] for i in idx],
                               ["; ".join(details[i]) for i in idx])
        stats.count("rejected", (first_reason[i] for i in idx))
        if idx:
            stats.keep("examples", reject_examples(batch, idx, first_reason, details, self.sides), MAX_EXAMPLES)
        return Outcome(kept=batch.filter(pa.array(~mask)), rejected=rejected, stats=stats)

    # -- report ----------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return describe_quality(self)
