"""The results store, one module per job: `schema` (typed header, row and case-status
records, validated in one place), `environment` (where a run is measured), `files` (the
results folder, its run files, a file's header line), `writer` (append-only, durable JSON
lines), `reader` (loading, finding and summarizing runs), `frame` (pandas export) and
`merge` (joining shards). Import each name from its module; the modules import one
another without cycles (schema, environment, files <- frame <- reader <- merge;
writer <- merge).

A run is one file, ``out/results/<run-id>.jsonl``: line 1 a header, then one line per
measurement row or case status (see docs/results-format.md). Nothing here imports
``paged`` or ``kernels``.
"""
