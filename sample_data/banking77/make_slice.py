"""Rebuild this folder's CSVs from the shared banking77 copy (deterministic).

    python sample_data/banking77/make_slice.py

train.csv: a long-tailed slice of the real train split - classes in a seeded random order,
class at rank r keeps its first round(60 * 20 ** (-r / 76)) rows in file order (60 down to
3, imbalance ratio 20). test.csv: the first 10 rows of every class of the real test split
(balanced). Rows are unchanged and keep the original file order.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent.parent / "shared" / "data" / "banking77"


def read(name: str) -> list[dict[str, str]]:
    with open(SRC / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write(name: str, rows: list[dict[str, str]]) -> None:
    with open(HERE / name, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["text", "category"], lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    train, test = read("train.csv"), read("test.csv")
    classes = sorted({r["category"] for r in train})
    order = np.random.default_rng(77).permutation(len(classes))
    quota = {classes[j]: int(round(60 * 20 ** (-r / (len(classes) - 1)))) for r, j in enumerate(order)}
    seen: dict[str, int] = defaultdict(int)
    keep = []
    for row in train:
        if seen[row["category"]] < quota[row["category"]]:
            seen[row["category"]] += 1
            keep.append(row)
    write("train.csv", keep)
    seen.clear()
    test_keep = []
    for row in test:
        if seen[row["category"]] < 10:
            seen[row["category"]] += 1
            test_keep.append(row)
    write("test.csv", test_keep)
    print(f"train {len(keep)} rows, test {len(test_keep)} rows")


if __name__ == "__main__":
    main()
