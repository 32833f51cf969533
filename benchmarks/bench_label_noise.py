"""Label-noise detection benchmark for `dataguard.stages.noise.NoiseStage`.

Run (from the repo root, system python, no extra env needed; offline; use `nice` on a shared box):

    nice python benchmarks/bench_label_noise.py [--parts news,agree,banking,lengths]

``--cache-dir`` (default benchmarks/results/noise_cache, git-ignored; '' = none) keeps
sentence embeddings (keyed by model + text hash) and every cross-validated stage's
probabilities + describe() summary (keyed by data hash + stage parameters), so a rerun only
re-reads them: method / budget variants go through ``NoiseStage(probabilities=<cached .npy>)``
as a user would. From scratch on the loaded 2-core box: banking77 embeddings ~5 min, each
banking77 CV with C chosen by CV 10-17 min, each 20NG TF-IDF CV ~2.5 min; MiniLM on the
7.5k full 20NG posts takes 10-60 min (only the ``embedding`` / ``both`` news configs need it).

Parts
-----
news     20 Newsgroups test set (../shared/data/20news_label_errors): 7,532 raw posts, 82 label
         errors confirmed by MTurk reviewers. Our out-of-sample probabilities come from the raw
         texts only (5-fold CV inside the test set, no training set). We rank rows by
         ``label_quality`` and count confirmed errors in the worst 2% (151 rows, "hits@151");
         then the rows each rule flags: confident learning, the seeds' rule (``method:
         confidence``, max p > 0.8 on another class) and confident learning capped by
         ``max_flagged: 151``. ``--news-configs features[:rounds],...`` (default tfidf,tfidf:2,auto).
         Reference: cleanlab's published probabilities + prune_by_noise_rate flag 95 rows
         holding 55 of the 82.
agree    Our ``is_label_issue`` masks vs ``cleanlab.filter.find_label_issues`` for the same
         filter, on cleanlab's published 20news probabilities and on ours.
banking  banking77 train (10,003 rows, 77 intents) with seeded class-conditional noise at 10%
         and 20%: precision / recall / F1 of detection per features / rounds / method
         (``--banking-configs``, default embedding,auto,auto:2; rounds only at the first rate);
         then a classifier (SGD logistic on MiniLM embeddings) trained on noisy vs cleaned
         (drop) vs relabelled vs the original labels, accuracy on the clean test set (3,080 rows).
news-dynamics  (issue #27) the same 82 errors from a fine-tuned model's training dynamics: the
         7,532 posts (ids ``news:<row>``) through an empty pipeline, ``dataguard train`` on them
         with dynamics on (``--news-model``, default minilm; ``--news-epochs`` 4, ``--news-max-length`` 256,
         batch 32, lr 1e-4, head x10, eval_fraction 0 so every post is a training row), then
         the noise stage's ``inputs: dynamics``: hits in the worst 151 by AUM and by confidence,
         and found / flagged with the learned cut and with ``max_flagged: 151``.
         ``--news-run RUN`` reuses a finished run (e.g. one trained on a GPU). Measured at 3
         epochs x 128 tokens (below); the default 4 x 256 is about 900 steps of 32 x 256
         tokens, GPU work.
banking-dynamics  (issue #27) banking77 train with the last ``--rates`` noise (default 20%, the
         same seeded class-conditional flips as part banking) through an empty pipeline (ids
         ``banking:<row>``), MiniLM fine-tuned on all of it with dynamics on (``--banking-epochs``,
         default 3; batch 32, lr 1e-4, head x10, max_length 64, eval_fraction 0), then the noise
         stage's ``inputs: dynamics`` by AUM and by confidence: precision / recall / F1 of the
         flags with the learned cut, at the number of flipped rows, and at the CV stage's 2,031
         flags (part banking's auto detector); then the two views: part banking's cross-validated
         probabilities (auto features, read from the same cache) alone and with the run's
         dynamics beside them (``dynamics: RUN`` with cross-validated inputs: confident learning
         counts, the out-of-fold margin and the run's score rank together).
         ``--banking-run RUN`` reuses a finished run.
         ``--banking-threshold`` also trains the two runs of Pleiss et al.'s threshold rows
         (``threshold_rows: 1`` and ``2``, same settings) and reports the flags from both together
         with the cut their fake-class rows learn.
lengths  Where ``features: auto`` switches: 20NG posts cut to their Subject + first N words
         (``--length-cuts``, default 16,32), hits@151 for tfidf / embedding / ensemble.

Results
-------
news-dynamics, measured 2026-12-03 (issue #27; commit 580456f, 2 cores shared with a second
benchmark, ``--parts news-dynamics --news-epochs 3 --news-max-length 128 --threads 2``: 708
MiniLM steps of 32, 62 min, final training loss about 0.75), 82 confirmed errors in 7,532 posts:

  score                                cut                       hits@151  flagged  found
  aum                                  learned cut               24        2420     71
  aum                                  max_flagged 151           24        151      24
  cartography                          learned cut               21        1578     62
  cartography                          max_flagged 151           21        151      21
  cross-validated tfidf, alone         confident learning count  59        158      53
  cross-validated tfidf, alone         max_flagged 151           59        151      53
  cross-validated tfidf + aum          confident learning count  40        158      41
  cross-validated tfidf + aum          max_flagged 151           40        151      40
  cross-validated tfidf + cartography  confident learning count  39        158      39
  cross-validated tfidf + cartography  max_flagged 151           39        151      39

  * The goal (>= 65 of 82 in 151 flags from a fine-tuned model's dynamics) is NOT met: the
    run's AUM finds 24, TF-IDF cross-validation 59. MiniLM reads 128 tokens of a post, most
    of them headers and the first lines. Its training accuracy per epoch is 0.56, 0.85, 0.93;
    in the third epoch it gets 510 posts wrong, only 42 of them confirmed errors, and it has
    already memorised the other 40 errors (it predicts their given label). So its low-AUM
    rows are mostly hard or cut-short posts, and half the errors look clean. The learned cut
    flags 2,420 rows (71 of the 82 among them): the ranking, not the cut, is what fails.
  * Two views need two good views: beside this weak run the TF-IDF ranking drops from 59 to
    40. On banking77, where the run alone is as good as the CV stage (0.907 vs 0.902), the
    two together gain (0.934). The stage cannot tell a weak view from a strong one without
    the truth; the README says a second view helps only where the run ranks as well as CV.
  * Weak, not only memorising (measured 2026-12-03 on the same run, printed after the table):
    a row's first-pass entry is the model's verdict before it ever trained on that row. On
    the 3,788 posts of the first epoch's second half (46 confirmed errors; the model had seen
    the other half) it is right on 0.717 and finds 4 errors in the worst 76 by margin;
    cross-validated TF-IDF on the same rows is right on 0.922 and finds 33. So cross-fitting
    the fine-tune (out-of-fold dynamics) would not close the gap either: MiniLM reading 128
    tokens is the weaker model of 20NG posts, and a strong second view needs a model that
    reads them whole.
  * Next: 256+ tokens and more epochs (the defaults: GPU work), or a bigger model.

banking-dynamics, measured 2026-12-02 (issue #27; commit 7f64cb2, 2 cores, ``--parts
banking-dynamics --rates 0.2 --banking-epochs 3``: 939 MiniLM steps of 32, 27 min, final
training loss about 1.7), banking77 train, 20% class-conditional noise, 1,998 flipped rows:

  score        cut               flagged  precision  recall  F1
  aum          learned cut       2597     0.760      0.988   0.859
  aum          max_flagged 1998  1998     0.903      0.903   0.903
  aum          max_flagged 2031  2031     0.900      0.914   0.907
  cartography  learned cut       2223     0.828      0.921   0.872
  cartography  max_flagged 1998  1998     0.862      0.862   0.862
  cartography  max_flagged 2031  2031     0.860      0.874   0.867
  (cross-validated noise stage, auto features, part banking below: 2031 flagged, F1 0.902)

  * AUM alone does not reach the goal F1 >= 0.92: 0.907 at the CV stage's own flag count. AUM
    ranks better than confidence (0.903 vs 0.862 at the true count), as on the long tail.
  * The learned (mixture) cut over-flags here: recall 0.988 for precision 0.760. The AUM
    ranking is good; the cut is where the figure is lost. Pleiss et al.'s threshold rows,
    measured below, under-flag instead.
  * One run, 3 epochs at lr 1e-4; a longer fine-tune was not tried (CPU).

  Two views (measured 2026-12-02 at the commit that added them, the same run_3ep and part
  banking's cached probabilities; ``--threads 1``):

  score                          cut                       flagged  precision  recall  F1
  cross-validated, alone         confident learning count  2031     0.893      0.908   0.900
  cross-validated + aum          confident learning count  2031     0.926      0.941   0.934
  cross-validated + cartography  confident learning count  2031     0.919      0.934   0.926

  * The goal F1 >= 0.92 is met by the two views together: +0.034 over the CV stage and +0.027
    over the AUM alone at the same 2,031 flags. The two models err on different rows (a
    linear probe on frozen MiniLM features; the fine-tuned MiniLM, which slowly memorises some
    flips), and confident learning's count (2,031 for 1,998 flips) avoids the over-flagging of
    the mixture cut. Combining scores was checked on these saved files before it was built:
    percentile ranks 0.934, robust z-scores 0.934, AUM with the CV self-confidence instead of
    the margin 0.900, picking per class by confident learning's per-class counts 0.915
    (cleanlab's margin filters also pick globally).

  Threshold rows (Pleiss et al.; ``--banking-threshold``, measured 2026-12-02 at commit
  fe4034d: two more runs with the same settings, ``threshold_rows: 1`` and ``2``, 128 rows each
  under the fake class, 79 and 67 min on shared cores), AUM:

  dynamics                cut                          flagged  precision  recall  F1
  threshold run 1         threshold rows (-1.923)      1442     0.945      0.682   0.792
  threshold run 2         threshold rows (-1.860)      1485     0.943      0.701   0.804
  threshold runs 1 + 2    threshold rows (-1.891)      1485     0.945      0.703   0.806
  threshold runs 1 + 2    max_flagged 1998             1998     0.902      0.902   0.902
  threshold runs 1 + 2    max_flagged 2031             2031     0.901      0.916   0.908

  * The threshold rows' cut under-flags where the mixture over-flags: the fake class is a
    random draw of rows from every intent, which the model can only memorise, while these
    flips go to three confusable intents per class, a pattern it partly learns, so flipped
    rows keep a higher AUM than fake-class rows (cut -1.89; in the plain run the flipped
    rows' median AUM is -2.43 and a quarter of them lie above -1.76). F1 0.806 against the mixture's 0.859,
    so the mixture stays the default for a single run; with threshold runs the cut is the
    paper's. Neither learned cut reaches the ranking's own 0.902-0.912.
  * Two runs average each row's AUM, but they share a seed: at 2031 flags the ranking gives
    0.908 against the plain run's 0.907, no real gain.

Measured 2026-12-01 (issue #14; shared 2-core CPU, heavily loaded; secs = wall time):

20 Newsgroups: confirmed errors (of 82) found. hits@151 = in the worst 151 rows by label
quality; then flagged / found (P = found / flagged, a lower bound: unreviewed rows may be
errors too; R = found / 82):
  probabilities              cv acc  C    hits@151  cleanlab            confidence>0.8     cleanlab, max_flagged 151
  cleanlab published pyx     0.923   -    56        95 / 55 (P .58 R .67)  14 / 11 (P .79 R .13)  95 / 55
  tfidf, rounds 1            0.921   100  59        156 / 53 (P .34 R .65) 110 / 48 (P .44 R .59) 151 / 53 (P .35 R .65)
  tfidf, rounds 2            0.920   100  52        126 / 42 (P .33 R .51)  93 / 39 (P .42 R .48) 126 / 42
  auto (-> tfidf), rounds 1  0.921   100  59        156 / 53               110 / 48               151 / 53
  (embedding, the old default, from 2026-11-29 (not rerun: MiniLM on 7.5k long posts):
   hits@151 18, 572 flagged / 47 found)
  * Goal ">= 65 of 82 within 151 flagged" NOT reached: 59 (ranking) / 53 (flag mask capped
    at 151). Exploration on the same cached TF-IDF (not in the script): unigram TF-IDF 62,
    10 folds 59, 3 CV seeds averaged 58, C 30 / 300: 58 / 57, header-free body + Subject 53,
    averaged SGD 59, multinomial NB 40 (+SGD 49-52). Differences of +-3 are within the
    noise of 82 labels, so none replaced the default.
  * rounds 2 finds fewer confirmed errors (52 vs 59; 42 vs 53 flagged): not the default.
  * The seeds' rule is more precise and far less complete (cleanlab pyx: 11 of 82).

Where auto switches (part lengths; 20NG Subject + first N words, hits@151):
  N words  tfidf  embedding  ensemble
  16       32     20         31
  32       42     18         38
  full     59     18         -
  and banking77 (median 10 words, 10% noise) F1: ensemble 0.881, embedding 0.844, tfidf 0.782.
  So: median <= 16 words -> ensemble, else TF-IDF (`AUTO_MAX_WORDS`). Length is a proxy:
  topic posts favour TF-IDF at any length measured, intents favour embeddings.

banking77 with class-conditional noise (3 confusion targets per class, seed 0), action=relabel,
C by CV (auto: embedding C / TF-IDF C):
  noise  features   rounds  C     method      flipped  flagged  precision  recall  F1
  10%    embedding  1       10    cleanlab    1003     1142     0.792      0.902   0.844
  10%    embedding  1       10    confidence  1003     311      0.981      0.304   0.464
  10%    auto       1       10/10 cleanlab    1003     1023     0.872      0.889   0.881
  10%    auto       1       10/10 confidence  1003     296      0.980      0.289   0.446
  10%    auto       2       10/10 cleanlab    1003     1043     0.861      0.895   0.878
  10%    auto       2       10/10 confidence  1003     538      0.963      0.516   0.672
  20%    embedding  1       10    cleanlab    1998     2220     0.829      0.921   0.872
  20%    embedding  1       10    confidence  1998     151      1.000      0.076   0.141
  20%    auto       1       10/1  cleanlab    1998     2031     0.895      0.909   0.902
  20%    auto       1       10/1  confidence  1998     0        -          0.000   0.000
  * auto (ensemble: SGD on embeddings + SGD on TF-IDF + 25-NN cosine votes, averaged) beats
    the old default at both rates (goal F1 >= 0.88 at 10%: 0.881, met). Chosen from a few
    ensembles tried on the 10% set (emb+tfidf 0.857-0.863, +char n-grams 0.875, geometric
    mean 0.871); the 20% set was not used to choose and confirms it (+0.030).
  * The seeds' rule (max p > 0.8 and argmax != given) is precise but misses most errors, and
    it depends on calibration: averaged ensemble probabilities rarely exceed 0.8 over 77
    classes, so with auto it flags almost nothing. Use it with a fine-tuned model's
    (tempered) logits, not with these CV probabilities.
  test accuracy (clean test set) of SGD-logistic on embeddings trained on noisy / cleaned
  (drop) / relabelled / original labels: 20% noise, embedding detector 0.8854 / 0.9114 /
  0.9058 / 0.9250; auto detector 0.8854 / 0.9179 / 0.9068 / 0.9250. 10% noise: embedding
  0.9107 / 0.9214 / 0.9208 / 0.9250; auto 0.9107 / 0.9218 / 0.9179 / 0.9250.
  * rounds 2 (10%, auto): F1 0.878 vs 0.881 - no gain here either; the refit models are
    confident on the rows they excluded, so the seeds' rule then flags more (538 vs 296).

Earlier results (before issue #14)
----------------------------------
Measured 2026-11-29 on the shared 2-core CPU (heavily loaded; seconds are wall time):

20 Newsgroups test set: confirmed errors (of 82) in the worst 151 rows (2%)
  probabilities                       rank_by            cv acc  hits@151  prune_by_noise_rate flagged / hits
  cleanlab published pyx (reference)  self_confidence    0.923   56        95 / 55
  ours: tfidf, sgd, C=100             normalized_margin  0.921   59        158 / 53
  ours: embedding, sgd, C=10          normalized_margin  0.826   18        572 / 47
  ours: both, sgd, C=100              normalized_margin  0.911   36        236 / 45

  From raw text alone (CV inside the 7.5k test posts, no training set) TF-IDF finds 59/82 at
  the 2% budget vs 55/82 (95 flagged) / 56/82 (top 151) for cleanlab's published
  probabilities. MiniLM sees only the first 128 tokens (mostly headers), so embeddings hurt
  here. Caveat: ranking cleanlab's own pyx by normalized_margin finds 82/82 - the 93 rows
  sent to reviewers were chosen from that model's ranking, so only errors it flagged can
  count as "confirmed"; an independent model is penalised for real errors nobody checked.
  Exploration (not in the script): multinomial logistic regression on the same TF-IDF,
  C=10: 56 hits (normalized_margin) / 44 (self_confidence), 8 min per CV; SGD C sweep in
  the old alpha scale gave 46 / 59 / 58 / 59 hits for alpha 1e-4 / 1e-5 / 3e-6 / 1e-6.

Issue masks vs cleanlab.filter.find_label_issues (20 Newsgroups): 0 rows differ for every
filter_by (prune_by_noise_rate, prune_by_class, both, confident_learning,
predicted_neq_given) on cleanlab's pyx (95 / 96 / 45 / 55 / 577 flagged) and on our
embedding (572 / 593 / 403 / 405 / 1313) and both (236 / 236 / 148 / 188 / 672) probabilities.

banking77 train with class-conditional noise (3 confusion targets per class, seed 0), stage
defaults (MiniLM embedding, SGD, C by CV), action=relabel:
  noise  C   flipped  flagged  precision  recall  F1     relabelled (correct)
  10%    10  1003     1142     0.792      0.902   0.844  978 (0.818)
  20%    10  1998     2220     0.829      0.921   0.872  1600 (0.892)

banking77 test accuracy (clean test.csv, 3,080 rows), SGD-logistic on MiniLM embeddings:
  noise  noisy labels  cleaned (issues dropped)  relabelled (p>=0.5)  original labels
  10%    0.9107        0.9214                    0.9208               0.9247
  20%    0.8854        0.9114                    0.9058               0.9247
  Dropping the flagged rows recovers 76% (10%) and 66% (20%) of the accuracy lost to noise.

Feature choice on banking77 20% noise (exploration, 5-fold CV, cleanlab prune_by_noise_rate):
  tfidf+logreg F1 0.770, tfidf+sgd 0.807, emb+logreg 0.857, emb+sgd 0.871, both+logreg 0.815;
  label-quality ROC AUC of normalized_margin > self_confidence > confidence_weighted_entropy
  for every probability set (e.g. emb+sgd 0.991 / 0.987 / 0.981).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cleanlab.filter import find_label_issues  # noqa: E402

from dataguard.records import canonical_table  # noqa: E402
from dataguard.stages.noise.confident import FILTERS  # noqa: E402
from dataguard.stages.noise.crossval import make_classifier  # noqa: E402
from dataguard.stages.noise.stage import NoiseStage  # noqa: E402
from dataguard.testing.noise import inject_class_conditional_noise  # noqa: E402
from dataguard.text.embeddings import Embedder, embedding_field, to_arrow  # noqa: E402
from dataguard.text.features import embed_texts  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
BATCH = 2000


def table_for(texts: list[str], labels: list[str | None], source: str, emb: np.ndarray | None,
              model_id: str) -> pa.Table:
    t = canonical_table([{"id": f"{source}:{i}", "source": source, "messages": [{"role": "user", "content": x}],
                          "label": lab} for i, (x, lab) in enumerate(zip(texts, labels, strict=True))])
    if emb is not None:  # the stage reuses a prompt_embedding column instead of re-running the model
        t = t.append_column(embedding_field("prompt_embedding", emb.shape[1], model_id), to_arrow(emb))
    return t


def run_stage(stage: NoiseStage, table: pa.Table) -> tuple[pa.Table, pa.Table, float]:
    t0 = time.time()
    parts = [table.slice(i, BATCH) for i in range(0, table.num_rows, BATCH)]
    stage.fit([stage.summarize(p) for p in parts])
    outs = [stage.apply(p) for p in parts]
    stage.absorb([o.stats for o in outs])
    return (pa.concat_tables([o.kept for o in outs]), pa.concat_tables([o.rejected for o in outs]),
            time.time() - t0)


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))
    sys.stdout.flush()


def load_news() -> dict:
    d = DATA / "20news_label_errors"
    with gzip.open(d / "20news_test_texts.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    errors = {r["id"] for r in json.loads((d / "20news_mturk.json").read_text()) if r["mturk"]["given"] < 3}
    return {"texts": [r["text"] for r in rows], "names": [r["label_name"] for r in rows],
            "y": np.array([r["label"] for r in rows]), "errors": errors, "pyx": d / "20news_test_set_pyx.npy"}


def hits_at_budget(quality: np.ndarray, errors: set[int], budget: int) -> int:
    order = np.lexsort((np.arange(quality.size), quality))[:budget]
    return len(errors & set(order.tolist()))


def data_key(table: pa.Table) -> str:
    """Short content hash of a table's ids, texts and labels (cache keys change with the data)."""
    h = hashlib.sha256()
    for col in ("id", "label"):
        h.update(json.dumps(table.column(col).to_pylist()).encode())
    h.update(json.dumps([m[0]["content"] for m in table.column("messages").to_pylist()]).encode())
    return h.hexdigest()[:12]


def cached_probs(stage_kwargs: dict, table: pa.Table, cache: Path | None) -> tuple[str, dict]:
    """Run a CV stage once and keep its probabilities as .npy (+ its summary): later method /
    budget variants read them back through ``probabilities=<file>``, as a user would."""
    key = hashlib.sha256(json.dumps([data_key(table), stage_kwargs], sort_keys=True).encode()).hexdigest()[:16]
    folder = cache if cache is not None else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    path, meta = folder / f"probs-{key}.npy", folder / f"probs-{key}.json"
    if path.exists() and meta.exists():
        return str(path), json.loads(meta.read_text())
    stage = NoiseStage(**stage_kwargs)
    _, _, secs = run_stage(stage, table)
    summary = {**stage.describe()["summary"], "secs": round(secs)}
    np.save(path, stage.oof_probs)
    meta.write_text(json.dumps(summary))
    return str(path), summary


def probs_in_shard_order(probs_path: str, table: pa.Table, work: Path) -> tuple[Path, np.ndarray]:
    """(a copy of the cached probabilities in the shards' row order, each shard row's position in
    the source): a ``.npy`` has one row per row reaching the stage, in order; ids end ``:<row>``."""
    order = np.array([int(str(i).rsplit(":", 1)[1]) for i in table.column("id").to_pylist()])
    aligned = work / "cv_probs_in_shard_order.npy"
    np.save(aligned, np.load(probs_path)[order])
    return aligned, order


def verdicts(table: pa.Table, probs: str, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    """(is_label_issue, label_quality) of a stage reading cached probabilities."""
    kept, _, _ = run_stage(NoiseStage(probabilities=probs, **kwargs), table)
    return (np.asarray(kept.column("is_label_issue").to_pylist(), bool),
            np.asarray(kept.column("label_quality").to_pylist()))


def news_configs(args: argparse.Namespace) -> list[tuple[str, dict]]:
    out = []
    for spec in args.news_configs.split(","):
        features, _, rounds = spec.partition(":")
        kw: dict = {"features": features, "threads": args.threads}
        if rounds:
            kw["rounds"] = int(rounds)
        out.append((f"{features}, rounds {rounds or 1}", kw))
    return out


def part_news(args: argparse.Namespace, embedder: Embedder) -> dict[str, np.ndarray]:
    news = load_news()
    n = len(news["texts"])
    budget = math.ceil(0.02 * n)
    configs = news_configs(args)
    needs_emb = any(kw["features"] in ("embedding", "both", "ensemble") for _, kw in configs)
    emb = embed_texts(news["texts"], embedder, cache_dir=args.cache_dir) if needs_emb else None
    table = table_for(news["texts"], news["names"], "20news", emb, embedder.model_id)
    errors = news["errors"]
    rows = []
    probs_out: dict[str, np.ndarray] = {}
    sources = [("cleanlab published pyx (reference)", str(news["pyx"]), {"C": None}, "self_confidence")]
    for name, kw in configs:
        path, summary = cached_probs(kw, table, args.cache)
        sources.append((f"ours: {name}", path, summary, "normalized_margin"))
        probs_out[name] = np.load(path)
    for name, path, summary, rank_by in sources:
        probs = np.load(path)
        _, q = verdicts(table, path, rank_by=rank_by)
        cells = [name, f"{(probs.argmax(1) == news['y']).mean():.3f}", _c(summary.get("C")),
                 hits_at_budget(q, errors, budget)]
        for method, extra in (("cleanlab", {}), ("confidence", {}), ("cleanlab", {"max_flagged": budget})):
            mask, _ = verdicts(table, path, method=method, rank_by=rank_by, **extra)
            found = len(errors & set(np.flatnonzero(mask).tolist()))
            cells.append(f"{mask.sum()} / {found} (P {found / max(mask.sum(), 1):.2f} R {found / len(errors):.2f})")
        extra_note = summary.get("features_auto", {}).get("why", "") if isinstance(summary, dict) else ""
        rounds = summary.get("rounds") if isinstance(summary, dict) else None
        if rounds:
            extra_note = "; ".join(f"r{e['round']}: {e['trained_on']} rows, {e['issues']} issues" for e in rounds)
        rows.append([*cells, summary.get("secs", ""), extra_note])
    print_table(f"20 Newsgroups test set: confirmed errors (of {len(errors)}) found; hits@{budget} = in the worst "
                f"{budget} rows (2%) by label quality; flagged / found (precision vs confirmed, recall of 82)",
                ["probabilities", "cv acc", "C", f"hits@{budget}", "cleanlab flagged / found",
                 "confidence>0.8 flagged / found", f"cleanlab + max_flagged {budget}", "secs", "note"], rows)
    return probs_out


def part_news_dynamics(args: argparse.Namespace) -> None:
    """Confirmed 20NG errors found from a fine-tuned model's dynamics (see the docstring)."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.train.config import load_train_config
    from dataguard.train.loop import Trainer

    news = load_news()
    work = ROOT / "benchmarks" / "results" / "news_dynamics"
    data = work / "data"
    if not (data / "manifest.json").is_file():
        work.mkdir(parents=True, exist_ok=True)
        src = work / "news.jsonl"
        src.write_text("".join(json.dumps({"text": t, "label": n}) + "\n"
                               for t, n in zip(news["texts"], news["names"], strict=True)))
        Pipeline([], workers=1).run([InputSpec(path=str(src), name="news", format="labelled_text")], data)
    run = Path(args.news_run) if args.news_run else \
        work / f"run_{Path(args.news_model).name}_{args.news_epochs}ep_{args.news_max_length}tok"
    if not (run / "dynamics.arrow").is_file():
        Trainer(load_train_config({
            "task": "classify", "model": args.news_model, "data": str(data), "output": str(run), "epochs":
            args.news_epochs, "batch_size": 32, "lr": 1e-4, "lr_multipliers": {"head": 10.0},
            "max_length": args.news_max_length, "eval_fraction": 0.0, "logit_adjustment": False, "curriculum": False,
            "save_every": 10 ** 6, "threads": args.threads, "tensorboard": False, "dynamics": True}),
            progress=False).fit()
    from dataguard.train.data import RunShards

    table = RunShards.open(data, task="classify").table
    rows = []
    for score in ("aum", "cartography"):
        for label, extra in (("learned cut", {}), ("max_flagged 151", {"max_flagged": 151})):
            kept, _, _ = run_stage(NoiseStage(inputs="dynamics", dynamics=str(run), dynamics_score=score,
                                              **extra), table)
            pos = np.array([int(str(i).rsplit(":", 1)[1]) for i in kept.column("id").to_pylist()])
            quality = np.full(len(news["texts"]), np.inf)
            quality[pos] = [np.inf if q is None else q for q in kept.column("label_quality").to_pylist()]
            flagged = set(pos[np.asarray(kept.column("is_label_issue").fill_null(False).to_pylist(), bool)].tolist())
            rows.append([score, label, hits_at_budget(quality, news["errors"], 151), len(flagged),
                         len(flagged & news["errors"])])
    # two views: the cross-validated TF-IDF probabilities (what auto picks for long posts, part
    # news's cache) alone and with the run's dynamics beside them
    cv_table = table_for(news["texts"], news["names"], "20news", None, "")
    probs_path, _ = cached_probs({"features": "tfidf", "threads": args.threads}, cv_table, args.cache)
    aligned, order = probs_in_shard_order(probs_path, table, work)
    for tag, extra in (("cross-validated tfidf, alone", {}), ("cross-validated tfidf + aum", {"dynamics": str(run)}),
                       ("cross-validated tfidf + cartography",
                        {"dynamics": str(run), "dynamics_score": "cartography"})):
        for label, budget in (("confident learning count", {}), ("max_flagged 151", {"max_flagged": 151})):
            kept, _, _ = run_stage(NoiseStage(probabilities=str(aligned), **extra, **budget), table)
            quality = np.full(len(news["texts"]), np.inf)
            quality[order] = kept.column("label_quality").to_pylist()
            flagged = set(order[np.asarray(kept.column("is_label_issue").fill_null(False).to_pylist(), bool)].tolist())
            rows.append([tag, label, hits_at_budget(quality, news["errors"], 151), len(flagged),
                         len(flagged & news["errors"])])
    print_table(f"20 Newsgroups: confirmed errors (of 82) from the dynamics of {run}",
                ["score", "cut", "hits@151", "flagged", "found"], rows)
    out_of_sample(run, news, aligned, order)


def out_of_sample(run: Path, news: dict, cv_probs: Path, order: np.ndarray) -> None:
    """Is the fine-tuned model a weak ranker, or only a memorising one? A row's first-pass entry
    (``train_forward``: the step's forward before its update) is the model's verdict on a row it
    has never trained on. On the second half of the first epoch (the model has seen half the
    posts) compare its accuracy and its margin's hits with the cross-validated TF-IDF's on the
    same rows, at the same share of flags."""
    from dataguard.train.dynamics.file import read_dynamics

    table = read_dynamics(run)[0]
    first = np.asarray(table.column("pass").to_numpy()) == 0
    steps = np.asarray(table.column("step").to_numpy())[first]
    late = steps >= np.median(steps)
    pos = np.array([int(str(i).rsplit(":", 1)[1]) for i in np.asarray(table.column("id").to_pylist())[first]])[late]
    margin = table.column("margin").to_numpy(zero_copy_only=False)[first][late]
    correct = np.asarray(table.column("correct").to_pylist())[first][late]
    probs = np.load(cv_probs)
    cv = np.full((len(news["texts"]), probs.shape[1]), np.nan)
    cv[order] = probs
    y = news["y"][pos]
    given = cv[pos, y]
    other = cv[pos].copy()
    other[np.arange(len(pos)), y] = -np.inf
    cv_margin = given - other.max(axis=1)
    budget = round(151 * len(pos) / len(news["texts"]))
    errors = news["errors"]

    def hits(score: np.ndarray) -> int:
        return len(set(pos[np.argsort(score, kind="stable")[:budget]].tolist()) & errors)

    print_table(f"Out of sample: {len(pos):,} posts of the first epoch's second half ({len(set(pos.tolist()) & errors)} "
                f"confirmed errors), worst {budget} by each score",
                ["model", "accuracy", f"hits@{budget}"],
                [["fine-tuned run, first-pass margin", f"{correct.mean():.3f}", hits(margin)],
                 ["cross-validated TF-IDF, margin", f"{(cv[pos].argmax(1) == y).mean():.3f}", hits(cv_margin)]])


def _body(text: str, n_words: int) -> str:
    """A 20NG post as a short text: its Subject line and the first words of its body."""
    head, _, body = text.partition("\n\n")
    subject = [line for line in head.split("\n") if line.startswith("Subject:")]
    return " ".join(" ".join(subject + [body]).split()[:n_words])


def part_lengths(args: argparse.Namespace, embedder: Embedder) -> None:
    """Where ``features: auto`` should switch: 20NG posts cut to N words, each feature kind."""
    news = load_news()
    budget = math.ceil(0.02 * len(news["texts"]))
    rows = []
    for n_words in (int(x) for x in args.length_cuts.split(",")):
        texts = [_body(t, n_words) for t in news["texts"]]
        emb = embed_texts(texts, embedder, cache_dir=args.cache_dir)
        table = table_for(texts, news["names"], "20news", emb, embedder.model_id)
        for features in ("tfidf", "embedding", "ensemble"):
            path, summary = cached_probs({"features": features, "threads": args.threads}, table, args.cache)
            _, q = verdicts(table, path)
            rows.append([n_words, features, _c(summary["C"]), hits_at_budget(q, news["errors"], budget)])
    print_table(f"20 Newsgroups cut to Subject + first N words: confirmed errors in the worst {budget} rows",
                ["N words", "features", "C", f"hits@{budget}"], rows)


def _c(C: object) -> str:
    if isinstance(C, dict):
        return "/".join(f"{v:g}" for v in C.values())
    return "-" if C is None else f"{C:g}"


def part_agree(ours: dict[str, np.ndarray]) -> None:
    news = load_news()
    pyx = np.load(news["pyx"])
    sources = {"cleanlab pyx": pyx, **{f"ours ({k})": v for k, v in ours.items()}}
    rows = []
    for name, probs in sources.items():
        table = table_for(news["texts"], news["names"], "20news", None, "")
        table = table.append_column("p", pa.array(list(probs), pa.list_(pa.float64())))
        for filter_by in FILTERS:
            stage = NoiseStage(probabilities="p", filter_by=filter_by, min_rows_per_class=0)
            kept, _, _ = run_stage(stage, table)
            mask = np.asarray(kept.column("is_label_issue").to_pylist(), bool)
            expected = find_label_issues(news["y"], probs, filter_by=filter_by)
            rows.append([name, filter_by, int(expected.sum()), int(mask.sum()), int((mask != expected).sum())])
    print_table("Issue masks vs cleanlab.filter.find_label_issues (20 Newsgroups)",
                ["probabilities", "filter_by", "cleanlab flagged", "ours flagged", "rows differing"], rows)


def load_banking(split: str) -> tuple[list[str], list[str]]:
    with open(DATA / "banking77" / f"{split}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["category"] for r in rows]


def _prf(issue: np.ndarray, flipped: np.ndarray) -> tuple[float, float, float]:
    tp = int((issue & flipped).sum())
    p, r = tp / max(int(issue.sum()), 1), tp / max(int(flipped.sum()), 1)
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def part_banking(args: argparse.Namespace, embedder: Embedder) -> None:
    tr_text, tr_lab = load_banking("train")
    te_text, te_lab = load_banking("test")
    classes = sorted(set(tr_lab))
    idx = {c: i for i, c in enumerate(classes)}
    y = np.array([idx[c] for c in tr_lab])
    y_test = np.array([idx[c] for c in te_lab])
    e_tr = embed_texts(tr_text, embedder, cache_dir=args.cache_dir)
    e_te = embed_texts(te_text, embedder, cache_dir=args.cache_dir)

    def test_acc(x: np.ndarray, labels: np.ndarray) -> float:
        clf = make_classifier("sgd", seed=0, C=10.0, n_train=len(labels))
        clf.fit(x, labels)
        return float((clf.predict(e_te) == y_test).mean())

    det_rows, acc_rows = [], []
    for rate in (float(r) for r in args.rates.split(",")):
        noisy, flipped = inject_class_conditional_noise(y, rate, len(classes), seed=0)
        table = table_for(tr_text, [classes[i] for i in noisy], "banking77", e_tr, embedder.model_id)
        for spec in args.banking_configs.split(","):
            features, _, rounds = spec.partition(":")
            if rounds and rate != float(args.rates.split(",")[0]):
                continue  # rounds are measured at the first rate only (CPU time)
            kw: dict = {"features": features, "threads": args.threads}
            if rounds:
                kw["rounds"] = int(rounds)
            path, summary = cached_probs(kw, table, args.cache)
            for method in ("cleanlab", "confidence"):
                issue, _ = verdicts(table, path, method=method, action="relabel")
                p, r, f1 = _prf(issue, flipped)
                det_rows.append([f"{rate:.0%}", features, rounds or 1, _c(summary["C"]), method, int(flipped.sum()),
                                 int(issue.sum()), f"{p:.3f}", f"{r:.3f}", f"{f1:.3f}", summary.get("secs", "")])
            if spec == args.banking_configs.split(",")[0] or features == "auto" and not rounds:
                stage = NoiseStage(probabilities=path, action="relabel")
                kept, _, _ = run_stage(stage, table)
                issue = np.asarray(kept.column("is_label_issue").to_pylist(), bool)
                new = np.array([idx[c] for c in kept.column("label").to_pylist()])
                acc_rows.append([f"{rate:.0%}", features, f"{test_acc(e_tr, noisy):.4f}",
                                 f"{test_acc(e_tr[~issue], noisy[~issue]):.4f}", f"{test_acc(e_tr, new):.4f}",
                                 f"{test_acc(e_tr, y):.4f}"])
    print_table("banking77 train with class-conditional noise: detection (relabel action; cleanlab = confident "
                "learning prune_by_noise_rate, confidence = the seeds' rule max p > 0.8 and argmax != given)",
                ["noise", "features", "rounds", "C", "method", "flipped", "flagged", "precision", "recall", "F1",
                 "secs"], det_rows)
    print_table("banking77 test accuracy of SGD-logistic on MiniLM embeddings trained on ...",
                ["noise", "detector", "noisy labels", "cleaned (issues dropped)", "relabelled (p>=0.5)",
                 "original labels"], acc_rows)


def part_banking_dynamics(args: argparse.Namespace, embedder: Embedder) -> None:
    """banking77 flips found from a fine-tuned MiniLM's dynamics (see the docstring)."""
    from dataguard.io.readers import InputSpec
    from dataguard.pipeline import Pipeline
    from dataguard.train.config import load_train_config
    from dataguard.train.data import RunShards
    from dataguard.train.loop import Trainer

    tr_text, tr_lab = load_banking("train")
    classes = sorted(set(tr_lab))
    y = np.array([classes.index(c) for c in tr_lab])
    rate = float(args.rates.split(",")[-1])
    noisy, flipped = inject_class_conditional_noise(y, rate, len(classes), seed=0)
    work = ROOT / "benchmarks" / "results" / f"banking_dynamics_{rate:.2f}"
    data = work / "data"
    if not (data / "manifest.json").is_file():
        work.mkdir(parents=True, exist_ok=True)
        src = work / "banking77_noisy.jsonl"
        src.write_text("".join(json.dumps({"text": t, "label": classes[n]}) + "\n"
                               for t, n in zip(tr_text, noisy, strict=True)))
        Pipeline([], workers=1).run([InputSpec(path=str(src), name="banking", format="labelled_text")], data)
    run = Path(args.banking_run) if args.banking_run else work / f"run_{args.banking_epochs}ep"
    parts = (0, 1, 2) if args.banking_threshold else (0,)
    t0 = time.time()
    for part in parts:  # 0: the plain run; 1, 2: Pleiss et al.'s threshold rows, two disjoint sets
        out = run if part == 0 else work / f"run_{args.banking_epochs}ep_threshold{part}"
        if not (out / "dynamics.arrow").is_file():
            Trainer(load_train_config({
                "task": "classify", "model": "minilm", "data": str(data), "output": str(out), "epochs":
                args.banking_epochs, "batch_size": 32, "lr": 1e-4, "lr_multipliers": {"head": 10.0}, "max_length": 64,
                "eval_fraction": 0.0, "logit_adjustment": False, "curriculum": False, "save_every": 10 ** 6,
                "threads": args.threads, "tensorboard": False, "dynamics": True, "threshold_rows": part}),
                progress=False).fit()
    secs = time.time() - t0
    table = RunShards.open(data, task="classify").table
    rows = []
    budgets = [("learned cut", {})] + [(f"max_flagged {n}", {"max_flagged": n, "dynamics_cut": 100})
                                       for n in (int(flipped.sum()), 2031)]
    sources: list[tuple[str, str | list[str]]] = [("", str(run))]
    if args.banking_threshold:
        sources.append((" (threshold runs 1+2)", [str(work / f"run_{args.banking_epochs}ep_threshold{p}")
                                                  for p in (1, 2)]))
    for score, (tag, dynamics) in [(sc, src) for src in sources for sc in ("aum", "cartography")]:
        for label, extra in budgets:
            kept, _, _ = run_stage(NoiseStage(inputs="dynamics", dynamics=dynamics, dynamics_score=score,
                                              action="flag", **extra), table)
            pos = np.array([int(str(i).rsplit(":", 1)[1]) for i in kept.column("id").to_pylist()])
            issue = np.zeros(len(tr_text), bool)
            issue[pos] = np.asarray(kept.column("is_label_issue").fill_null(False).to_pylist(), bool)
            p, r, f1 = _prf(issue, flipped)
            rows.append([score + tag, label, int(flipped.sum()), int(issue.sum()), f"{p:.3f}", f"{r:.3f}", f"{f1:.3f}"])
    # two views: part banking's cross-validated probabilities (auto features, the same cache)
    # alone, then with the plain run's dynamics beside them (the method counts, both rank)
    e_tr = embed_texts(tr_text, embedder, cache_dir=args.cache_dir)
    cv_table = table_for(tr_text, [classes[i] for i in noisy], "banking77", e_tr, embedder.model_id)
    probs_path, _ = cached_probs({"features": "auto", "threads": args.threads}, cv_table, args.cache)
    aligned, order = probs_in_shard_order(probs_path, table, work)
    for tag, extra in (("cross-validated, alone", {}), ("cross-validated + aum", {"dynamics": str(run)}),
                       ("cross-validated + cartography", {"dynamics": str(run), "dynamics_score": "cartography"})):
        kept, _, _ = run_stage(NoiseStage(probabilities=str(aligned), action="flag", **extra), table)
        issue = np.zeros(len(tr_text), bool)
        issue[order] = np.asarray(kept.column("is_label_issue").fill_null(False).to_pylist(), bool)
        p, r, f1 = _prf(issue, flipped)
        rows.append([tag, "confident learning count", int(flipped.sum()), int(issue.sum()), f"{p:.3f}", f"{r:.3f}",
                     f"{f1:.3f}"])
    print_table(f"banking77 train, {rate:.0%} class-conditional noise: flips found from the dynamics of {run} "
                f"({args.banking_epochs} epochs; training {secs / 60:.0f} min)",
                ["score", "cut", "flipped", "flagged", "precision", "recall", "F1"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache-dir", default=str(ROOT / "benchmarks" / "results" / "noise_cache"),
                    help="embedding + probability cache (git-ignored; '' = none, compute from scratch)")
    ap.add_argument("--parts", default="news,agree,banking")
    ap.add_argument("--news-configs", default="tfidf,tfidf:2,auto",
                    help="features[:rounds],... (embedding / both need MiniLM on 7.5k long posts: slow)")
    ap.add_argument("--length-cuts", default="16,32", help="part lengths: words kept per 20NG post")
    ap.add_argument("--banking-configs", default="embedding,auto,auto:2", help="features[:rounds],...")
    ap.add_argument("--rates", default="0.1,0.2")
    ap.add_argument("--news-model", default="minilm", help="part news-dynamics: the model to fine-tune")
    ap.add_argument("--news-epochs", type=int, default=4)
    ap.add_argument("--news-max-length", type=int, default=256,
                    help="part news-dynamics: tokens of each post the model reads (its Subject line comes first)")
    ap.add_argument("--news-run", help="part news-dynamics: a finished training run to read instead")
    ap.add_argument("--banking-epochs", type=int, default=3, help="part banking-dynamics: MiniLM epochs")
    ap.add_argument("--banking-run", help="part banking-dynamics: a finished training run to read instead")
    ap.add_argument("--banking-threshold", action="store_true",
                    help="part banking-dynamics: also two runs with threshold rows (sets 1 and 2) and their cut")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.cache_dir = args.cache_dir or None
    args.cache = Path(args.cache_dir) if args.cache_dir else None
    import torch

    torch.set_num_threads(args.threads)
    embedder = Embedder(threads=args.threads)
    parts = args.parts.split(",")
    ours: dict[str, np.ndarray] = {}
    if "news" in parts:
        ours = part_news(args, embedder)
    if "agree" in parts:
        part_agree(ours)
    if "banking" in parts:
        part_banking(args, embedder)
    if "lengths" in parts:
        part_lengths(args, embedder)
    if "news-dynamics" in parts:
        part_news_dynamics(args)
    if "banking-dynamics" in parts:
        part_banking_dynamics(args, embedder)


if __name__ == "__main__":
    main()
