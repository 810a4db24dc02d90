"""From recorded numbers to what a reader sees: result tables, statistics, the paper's
claims and their verdicts, figures and learning curves, the gradient-stability metric and
what runs cost (docs/architecture.md)."""
