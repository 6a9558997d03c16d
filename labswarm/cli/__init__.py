"""The ``labswarm`` command line (typer): one module per command group; ``app`` is the entry point."""
