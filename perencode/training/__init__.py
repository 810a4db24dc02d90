"""The training step and what watches it: the session that owns the step, the memory check
before a run (`preflight`) and the metrics it logs (`tracking`). It never imports analysis or
commands (docs/architecture.md)."""
