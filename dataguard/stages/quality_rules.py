"""The quality stage's fixed parts: sides, default thresholds, reason codes, report bins.

(The rules, their defaults and their sources are tabled in `dataguard.stages.quality`.)
"""

from __future__ import annotations

import numpy as np

from dataguard.records import PROMPT_ROLES, RESPONSE_ROLES

SIDES = {"prompt": PROMPT_ROLES, "response": RESPONSE_ROLES}
TOP_DEFAULT = {2: 0.20, 3: 0.18, 4: 0.16}
DUP_DEFAULT = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
MAX_EXAMPLES = 20
SNIPPET = 240
HIST_EDGES = np.linspace(0.0, 1.0, 21)
HIST_SCORES = ("char_repeat_ratio", "url_char_ratio", "char_rep_ratio", "word_rep_ratio", "dup_line_frac",
               "top2_gram_char_frac", "dup5_gram_char_frac")
MAX_TEXT_BYTES_DEFAULT = 8 << 20  # the readers' record-size limit: any side of a record that was read fits
TOO_LONG = "text_too_long"

REASONS = {  # code -> meaning (`dataguard.stages.quality` tables the rules)
    TOO_LONG: "a side is longer than max_text_bytes (or alone ran out of memory), so it was not scored",
    "char_repeat": "too many characters equal to the one before (char_repeat_ratio)",
    "too_many_urls": "too many URLs (url_count)",
    "url_ratio": "mostly URLs (url_char_ratio)",
    "special_characters": "too many special characters (special_char_ratio)",
    "char_ngram_repetition": "repeated character n-grams (char_rep_ratio)",
    "word_ngram_repetition": "repeated word n-grams (word_rep_ratio)",
    "duplicate_lines": "repeated lines (dup_line_frac, Gopher)",
    "duplicate_line_chars": "characters in repeated lines (dup_line_char_frac, Gopher)",
    "gopher_top_ngram": "the most frequent n-gram covers too much of the text (Gopher)",
    "gopher_dup_ngram": "duplicated n-grams cover too much of the text (Gopher)",
}
