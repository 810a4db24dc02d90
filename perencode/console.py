"""The one rich console for people (stderr); machines read the files a command writes."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)


def fit_name(name: str, width: int) -> str:
    """`name` in at most `width` characters: a run name too long for its column loses its
    middle, never its last part (`vocab_size=32/…/seed=111`), so rows that differ only by
    seed stay apart in an 80-column log."""
    if len(name) <= width:
        return name
    if width < 2:
        return name[-width:] if width > 0 else ""
    head, sep, last = name.rpartition("/")
    tail = sep + last if head else name
    if len(tail) > width - 1:  # even the last part is too long: keep its end
        return "…" + name[-(width - 1):]
    return name[:width - 1 - len(tail)] + "…" + tail
