"""The floor every other stands on: one-line user errors, the console, the commands'
defaults, atomic files, progress reporting and the device. It imports no other floor
(docs/architecture.md)."""
