"""The tasks veritrain ships, by name: where each one's Task class and TaskSpec are ("module:NAME"), imported when a
run first builds it or asks for its declaration (so that config validation and light commands load no torch).
veritrain.core.task_registry reads this table once; a task from elsewhere registers the same way
(`veritrain.tasks.register_task`)."""

from __future__ import annotations

DEFAULT = "classification"  # the config's `task` when it names none
TASKS = {"classification": "veritrain.tasks.classification:ClassificationTask", "lm": "veritrain.tasks.lm:LanguageModelTask"}
SPECS = {"classification": "veritrain.tasks.classification_spec:SPEC", "lm": "veritrain.tasks.lm_spec:SPEC"}
# the model section of a task whose TaskSpec declares none: the built-in image models' (cnn, mlp, resnet18)
MODEL_SECTION = "veritrain.tasks.image_models:ImageModelConfig"
