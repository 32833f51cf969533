"""Optimisation: the losses (logit-adjusted cross-entropy, the causal LM loss and the step's
weight mass), the lean SFT forward that never builds the full logits (`forward`), and the
optimizer, schedule and layer-wise clipping (`optimizer`)."""
