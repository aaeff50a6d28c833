"""The data stage: read a source, hash every sample, split, and store an immutable data version.

Entry point: `veritrain.data.prepare.run(...)`; training reads the stored version through
`veritrain.data.prepare.load_version(...)`. The stage's parts: `identity` (the version id, opening a stored
version), `table` (the sample table), `grouping` (duplicates, groups, the split and its checks), `store` (writing
`.veritrain/data/<id>/`), over `sources`, `validate`, `dedup`, `split`, `label_issues` and `report`.
"""
