"""The trust layer: what checks a run someone hands you. `verify` re-hashes it and compares runs, `audit` replays
sampled segments of its trajectory, `check` gives the checklist, `archive` packs and imports runs, `opening`
opens a finished run for a command only when it verifies and its code may run."""
