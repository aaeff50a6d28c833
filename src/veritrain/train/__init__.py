"""The training stage: the engine (`veritrain.train.engine`), the built-in recipe over it (`veritrain.train.recipe`),
the earlier loop its older runs keep (`veritrain.train.loop`), and checkpoint files."""
