"""The run engine behind `dataguard.pipeline.Pipeline`, one job per module.

* ``splits`` - plan input splits: JSON-lines files become byte ranges that workers index
  and read themselves (the driver sends descriptors, never rows); other inputs are read
  in the driver;
* ``segment`` - plan fused segments and run one segment's ops on one unit (the only
  module that knows the ops: source, score, summarize, apply);
* ``units`` - a segment's units, and which of them a previous run already finished (taken
  from the work folder, not run again);
* ``workdir`` - the resume folder ``OUTPUT/_work``: every file name in it, the resume
  fingerprint, and the per-unit results (with the fit summaries fitted state is rebuilt from);
* ``shards`` - cut the last segment's units into the final data/rejected shards;
* ``manifest`` - the manifest's typed schema (shared with `dataguard.report.load`) and
  the code that builds it.

Executors (`dataguard.executors`) only schedule units; they never look inside one.
"""
