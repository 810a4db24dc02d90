"""One module or package per `perencode` command, each run by perencode.cli: none imports
another; what two share lives on the floors below (docs/architecture.md)."""
