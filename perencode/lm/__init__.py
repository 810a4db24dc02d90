"""WikiText-103 language modelling data (docs/paper-facts.md#language-modelling): `prepare` builds a
folder, `data` reads it."""
