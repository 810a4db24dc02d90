"""WikiText-103 language modelling data (SPEC §7): `prepare` builds a folder, `data` reads it."""
