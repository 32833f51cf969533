"""Keeping a run stable: the monitor (per-layer norms, update ratios), the guard that skips,
rolls back and stops (`guard`, the states it rolls back to in `snapshots`, their tensors in
`snapshot_store`, across a resume in `guard_resume`, its responses in `respond`) and planned
fault injection (`faults`)."""
