"""Train/validation overlap and benchmark contamination: token n-gram scan plus exact
copies, row by row.

How it works
------------
* ``fit`` builds one :class:`~dataguard.text.ngrams.NgramIndex` (sorted uint64 n-gram
  hashes + parallel (reference item, position) postings) from the reference sets (shipped
  benchmarks, user files) and from the run's own validation rows (collected by
  ``summarize`` from the sources named in ``validation_sources``), and a table of the
  hashes of every item's *whole* normalised token sequence (exact copies, any length).
* Normalisation (default): lowercase, NFKC, whitespace folding, digits kept; punctuation
  *between two letters or digits* is deleted (``Zack's`` -> ``zacks``, ``3/5`` -> ``35``,
  ``10-foot`` -> ``10foot``, ``<<16-3-4=9>>9`` -> ``163499``) and every other punctuation
  mark becomes a space. So deleting or changing punctuation
  inside a word cannot hide a copy. A reference item (or validation row) whose text holds
  such punctuation is indexed a second time in the *split* form (punctuation -> space,
  ``10 foot``) as a variant of the same item, so a copy that put spaces there is found
  too; per row and item the better form counts. ``normalize: {intraword: false}`` restores
  the older rule (punctuation -> space everywhere, one index entry per item).
* ``apply`` normalises every scanned message, tokenises it (the shared tokenizer; or words
  in ``mode="word"``), hashes all n-grams of each message with a vectorised polynomial
  hash, and looks them up. Messages are scanned separately, so no n-gram spans two turns.
* Per row it writes: ``overlap_ratio`` (share of the row's tokens covered by matching
  n-grams or by an exact copy), ``overlap_longest`` (longest covered span, tokens),
  ``overlap_ngrams`` (matching n-gram positions), ``overlap_ref_set``/``overlap_ref_item``
  (the reference item the row covers most, by share of that item's tokens),
  ``overlap_ref_coverage`` (that share), ``overlap_exact`` and ``contaminated``.
* A row is contaminated when

  - it is an **exact copy**: one of its scanned messages, or the row as a whole (its
    scanned messages in order), has the same normalised token sequence as a reference
    item or as a whole validation row, *whatever its length*. This closes the hole where
    texts shorter than ``n`` tokens (a 3-word validation row, a 5-token TruthfulQA
    question) have no n-gram and passed unseen. Short near-copies are handled by this
    rule only: case, punctuation and spacing edits vanish in normalisation; a short text
    that differs in words, or sits inside a longer message, is not flagged (it cannot be
    told from common phrasing). The detail says ``exact copy of <set> item <id>``.
  - or it shares at least one n-gram and either ``overlap_ratio >= threshold`` (the row is
    mostly reference text) or ``overlap_ref_coverage`` reaches the item's bar: that is
    ``ref_threshold`` for items of at least ``5 n`` tokens (65 at ``n = 13``) and
    ``ref_threshold * length / (5 n)`` for shorter ones (0.22 for a 48-token item with
    the default 0.3), because an edit costs a short item a larger share of its n-grams and
    one matching n-gram is already a large share of it (13 of 48 tokens is 0.27).
    Validation items are measured against the tokens an n-gram can reach.
* Train/validation leakage, both directions: training rows are scanned against the
  validation rows (reference set ``validation``), exact copies included; validation rows
  are scanned against the benchmarks only, and the stage's tally keeps, per validation row, the
  training row that covers most of it. ``cross_split_exact_duplicates`` counts training
  rows that are, as a whole, an exact (normalised) copy of a validation row; they are
  contaminated like any other copy (dropped with ``action: drop``). Near-exact ones are
  pairs where the training row is >= ``near_duplicate`` validation text and covers >=
  ``near_duplicate`` of the validation row.

Actions: ``flag`` (keep, ``contaminated`` column), ``drop`` (reason ``contamination``, the
detail names the set, the item and the measured shares, or says it is an exact copy),
``mask`` (remove the covered character spans from the messages, a message that is an exact
copy entirely; keep the row, ``overlap_masked`` = true; a row with nothing left is dropped
with reason ``contamination``).

Modules, one job each: ``encoding`` (normalise + tokenise, scanned rows), ``index`` (fit:
the n-gram index of references and validation rows, split-form variants), ``exact``
(whole-sequence copies), ``measure`` (per-row coverage and the item bar), ``spans``
(copied character spans, masking), ``report`` (statistics, details, describe) and
``stage`` (the :class:`OverlapStage` glue).
"""

from dataguard.stages.overlap.stage import OverlapStage

__all__ = ["OverlapStage"]
