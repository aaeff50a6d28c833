"""The training stage: `veritrain.train.loop.run` (the loop written out) and checkpoint files."""
