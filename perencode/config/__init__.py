"""What a user writes: recipes, grids and their validation, the recipe schema, the registry
of kinds a recipe may name (tasks, models, encodings) and the plugins that add to it. It
imports only perencode.common (docs/architecture.md)."""
