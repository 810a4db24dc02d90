"""Training and what watches it: the loop (`loop`), the session that owns the step
(`session`), planning: the memory a run needs, checked before it starts, and what runs
cost (`planning`), and the
TensorBoard event files of its logged rows (`tensorboard`; `metrics.jsonl` itself is
appended by perencode.store.runs). It never imports analysis or commands
(docs/architecture.md)."""
