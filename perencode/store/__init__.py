"""What a run leaves on disk and how it is read back: the run directory and its checkpoint
(`runs`), its identity (recipe, code, data), the directory lock, the environment report and a
run's summary. Below training: the step is recorded here, never imports from above
(docs/architecture.md)."""
