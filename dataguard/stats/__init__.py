"""Small, dependency-light statistics used by the fit-side stages.

- `psi`: population stability index with quantile / categorical bins.
- `kl`: KL divergence on the same bins; `mmd`: an RBF-kernel MMD permutation test.
- `reweighting`: class weights, resampling factors and curriculum phases for long tails.
- `logit_adjust`: Menon et al. (2021) logit adjustment, post-hoc and as a training loss.
- `hashing`: deterministic per-row uniforms from ids, so row-local sampling is reproducible.
"""
