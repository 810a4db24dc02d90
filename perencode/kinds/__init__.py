"""The kinds a recipe names: tasks (`tasks/`), models (`models/`) and positional encodings
(`encoding`), each registered beside its code, with what they share: the task's sizes a
model is built from (`shapes`), sequence scoring (`scoring`) and the prepared LM data
(`lm_data`). It imports config and common only (docs/architecture.md)."""
