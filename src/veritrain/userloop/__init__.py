"""The user's own training loop, verified: `veritrain.start` (`run.Run`), the guarantee levels, and the replays
(`replay`) that `veritrain reproduce`, `audit` and `train --resume` make of a script's run.

A run made this way is a run like any other (`runs/<id>/`, `record.json`, sealed), of kind `script`. What it
records: the canonical config (`canonical`), the calling script and the user modules it imported (`script`), the
inputs by content (`inputs`), the metrics, and checkpoints in the same hash-chained trajectory as the built-in
loop's (`state`). Which of veritrain's guarantees hold depends on what the script did (`levels`).
"""
