"""Language identification: keep the languages a fine-tune is meant for.

A row-local filter (no fit), written as the walk-through of CONTRIBUTING.md: ``score`` adds
``language`` (ISO 639-1 code, null when the text is too short to judge) and
``language_confidence`` (float32, the detector's normalised probability); ``apply`` rejects
rows whose language is not in ``languages`` with reason ``wrong_language``.

The detector is py3langid (BSD-3; 140 language labels, a naive Bayes model over byte n-grams that
ships inside the package, so nothing is downloaded). Short texts are where every detector
guesses, so a row is judged only when its text has >= ``min_chars`` characters and the
detector is >= ``min_confidence`` sure; anything else is kept (and its columns say why).
Only the first ``max_chars`` characters are read: a language does not change halfway
through a fine-tuning example often enough to pay for reading a whole book.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from dataguard.params import FRACTION, Interval, ListOf, Options, Satisfies
from dataguard.records import full_texts, prompt_texts, reject_rows, response_texts, set_column
from dataguard.stage import Outcome, Stage
from dataguard.tally import Tally

REASON = "wrong_language"
REASONS = {REASON: "the detected language is not one of `languages` (and the detector is sure enough)"}
TEXTS = {"prompt": prompt_texts, "response": response_texts, "full": full_texts}
ACTIONS = ("flag", "drop")
MAX_EXAMPLES = 10
# The detector's labels (ISO 639-1 where one exists, else 639-3), so `languages` is checked
# without loading the model in __init__; tests/test_language.py pins it to the model's own list.
KNOWN_LANGUAGES = frozenset({
    "ace", "af", "am", "an", "ar", "ary", "arz", "as", "az", "ba", "bcl", "be", "bg", "bn", "br", "bs", "ca",
    "crh", "cs", "cy", "da", "de", "dz", "el", "en", "eo", "es", "et", "eu", "ext", "fa", "fi", "fo", "fr",
    "fuv", "fy", "ga", "gcf", "gcr", "gd", "gl", "gom", "grc", "gu", "gug", "guw", "ha", "hbo", "he", "hi",
    "hr", "ht", "hu", "hy", "id", "ig", "is", "it", "ja", "jv", "ka", "kab", "kik", "kk", "km", "kn", "ko",
    "ku", "ky", "la", "lb", "lg", "lij", "ln", "lo", "lt", "ltg", "lv", "mg", "mk", "ml", "mn", "mr", "ms",
    "mt", "my", "ne", "nl", "nn", "no", "nso", "oc", "om", "or", "pa", "pcm", "pl", "ps", "pt", "qu", "ro",
    "ru", "rw", "sa", "sdh", "se", "si", "sk", "sl", "sn", "so", "sq", "sr", "st", "sv", "sw", "ta", "te",
    "tg", "th", "tk", "tl", "tr", "tt", "ug", "uk", "ur", "uz", "uzs", "vec", "vi", "vo", "wa", "wuu", "xh",
    "yo", "yue", "zh", "zu", "zxx",
})


def _detector() -> Any:
    """The packaged py3langid model with normalised probabilities (loaded once per process)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def supported_languages() -> list[str]:
    """The language codes the packaged model knows (loads it)."""
    return sorted(set(_detector().nb_classes))


class LanguageStage(Stage):
    """Tags each row with its language and drops (or flags) the ones not wanted."""

    name = "language"
    reasons = REASONS
    constraints = {
        "languages": [ListOf(Satisfies(lambda code: isinstance(code, str) and code in KNOWN_LANGUAGES,
                                       f"a language code the detector knows ({len(KNOWN_LANGUAGES)} in all, "
                                       "e.g. en, de, fr, zh, ja, es)"), min_len=1)],
        "text": [Options(*TEXTS)],
        "min_chars": [Interval(int, 0)],
        "min_confidence": FRACTION,
        "max_chars": [Interval(int, 1)],
        "action": [Options(*ACTIONS)],
    }

    def __init__(self, *, languages: Sequence[str] = ("en",), text: str = "full", min_chars: int = 20,
                 min_confidence: float = 0.8, max_chars: int = 2000, action: str = "drop") -> None:
        self.languages = sorted(set(languages))
        self.text = text
        self.min_chars = min_chars
        self.min_confidence = float(min_confidence)
        self.max_chars = max_chars
        self.action = action
        self._model: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Workers load the model themselves; it is not pickled with the stage."""
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    def output_columns(self) -> dict[str, pa.DataType]:
        return {"language": pa.string(), "language_confidence": pa.float32()}

    def _detect(self, texts: list[str]) -> tuple[list[str | None], np.ndarray]:
        if self._model is None:
            self._model = _detector()
        langs: list[str | None] = []
        conf = np.full(len(texts), np.nan, dtype=np.float32)
        for i, t in enumerate(texts):
            t = t.strip()
            if len(t) < self.min_chars:
                langs.append(None)
                continue
            lang, p = self._model.classify(t[: self.max_chars])
            langs.append(lang)
            conf[i] = p
        return langs, conf

    def score(self, batch: pa.Table) -> pa.Table:
        langs, conf = self._detect(TEXTS[self.text](batch))
        out = set_column(batch, "language", pa.array(langs, pa.string()))
        return set_column(out, "language_confidence", pa.array(conf, pa.float32(), mask=np.isnan(conf)))

    def apply(self, batch: pa.Table) -> Outcome:
        langs = batch.column("language").to_pylist()
        conf = batch.column("language_confidence").to_numpy(zero_copy_only=False)
        wanted = set(self.languages)
        wrong = np.array([lang is not None and lang not in wanted and c >= self.min_confidence
                          for lang, c in zip(langs, conf, strict=True)], dtype=bool)
        stats = Tally(counts=Counter(rejected=int(wrong.sum()), unjudged=sum(lang is None for lang in langs)))
        stats.count("seen", (lang or "(too short)" for lang in langs))
        if not wrong.any() or self.action == "flag":
            return Outcome(kept=batch, stats=stats)
        picked = np.flatnonzero(wrong)
        details = [f"detected {langs[i]!r} (p={conf[i]:.3f}); allowed: {', '.join(self.languages)}" for i in picked]
        texts = TEXTS[self.text](batch.take(pa.array(picked[:MAX_EXAMPLES], pa.int64())))
        stats.keep("examples", [{"id": batch.column("id")[int(i)].as_py(), "label": langs[i], "text": t[:300],
                                 "note": d} for i, t, d in zip(picked[:MAX_EXAMPLES], texts, details, strict=False)],
                   MAX_EXAMPLES)
        return Outcome(kept=batch.filter(pa.array(~wrong)), rejected=reject_rows(batch, wrong, self.name, REASON,
                                                                                 details), stats=stats)

    def describe(self) -> dict[str, Any]:
        seen = self.tally.counters.get("seen", Counter())
        top = seen.most_common(20)
        blocks: list[dict[str, Any]] = [
            {"type": "bar", "title": "Detected language (20 most frequent)", "labels": [k for k, _ in top],
             "series": {"rows": [v for _, v in top]}}]
        if self.tally.items("examples"):
            blocks.append({"type": "examples", "title": "Rows in another language",
                           "items": self.tally.items("examples")})
        return {"title": "Language identification",
                "summary": {"languages": ", ".join(self.languages), "action": self.action,
                            "rows": sum(seen.values()), "rows_not_judged": self.tally.get("unjudged"),
                            "rows_wrong_language": self.tally.get("rejected"), "min_confidence": self.min_confidence,
                            "min_chars": self.min_chars},
                "blocks": blocks}
