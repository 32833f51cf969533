"""Reason codes of rows the readers could not turn into records.

The normalizer reports them (a row that never became a record is rejected at the run's
first stage), so `Normalizer.reasons` includes these.
"""

from __future__ import annotations

READER_REASONS: dict[str, str] = {
    "invalid_json": "the line or item is not valid JSON",
    "invalid_utf8": "the bytes are not valid UTF-8 (the raw text is kept with the bad bytes escaped)",
    "too_deep": "arrays/objects nest deeper than the readers' limit",
    "empty_file": "the input holds no records at all (one row stands for the file)",
    "malformed_csv": "a CSV/TSV line does not parse (unbalanced quotes, wrong field count)",
    "record_too_large": "one record is larger than the readers' size limit",
    "corrupt_compressed_file": "a compressed input ends early or is not valid compressed data",
    "unreadable_file": "the input, or part of it, could not be read (an I/O error, a corrupt Parquet file)",
}
