"""The base layer: config (schema, safe YAML, overrides, messages), hashing, files, secrets, errors, logs,
signals, locks, display, the split discipline (selection) and the task and source registries. Imports nothing
from the layers above (docs/architecture.md)."""
