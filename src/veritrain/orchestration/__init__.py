"""The orchestration layer: `pipeline` (run, train, resume; eval, export and baseline of a run), `reproduce`,
`smoke`, `repeats`, `sweep` and its trials, `housekeeping` (gc) and `notes`. Kept empty of imports: a sweep's
trial process imports only what it needs before its signal handling is in place."""
