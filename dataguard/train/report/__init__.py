"""What a run records and shows: ``metrics.jsonl`` / ``events.jsonl`` (`metrics_log`,
`jsonl_log`), and the self-contained training page (`page`, built from `page_data`, with the
rows of anomalies in `rows` and the charts in `svg`)."""
