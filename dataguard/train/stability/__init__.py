"""Keeping a run stable: the monitor (per-layer norms, update ratios), the guard that skips,
rolls back and stops (`guard`, its resume state in `guard_resume`, its snapshots in
`snapshot_store`, its responses in `respond`) and planned fault injection (`faults`)."""
