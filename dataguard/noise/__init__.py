"""Label-noise estimation: cross-validated probabilities and confident learning (cleanlab)."""
