"""The results store, one module per job: `schema` (typed header, row and case-status
records, validated in one place), `environment` (where a run is measured), `writer`
(append-only, durable JSON lines), `reader` (loading, finding and summarizing runs),
`frame` (pandas export) and `merge` (joining shards). `kvbench.reports.results` re-exports
the public names, so code that imports from there keeps working."""
