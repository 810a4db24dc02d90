"""The one rich console for people (stderr); machines read the files a command writes."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)
