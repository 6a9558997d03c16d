"""``python -m labswarm.cli ARGS``: the ``labswarm`` command (the console script is the same typer app)."""

from labswarm.cli.main import app

app()
