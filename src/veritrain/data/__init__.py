"""The data stage: read a source, hash every sample, split, and store an immutable data version.

Entry point: `veritrain.data.prepare.run(...)`; training reads the stored version through
`veritrain.data.prepare.load_version(...)`.
"""
