"""minGRU as a perencode model (an example plugin package).

`mingru` holds the model and its hooks; `plugin` registers it (the package's entry point in
the group `perencode.kinds` names that module). Importing the package itself registers
nothing, so the model can be used and tested on its own.
"""
