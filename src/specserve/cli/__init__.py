"""The `specserve` command: `main.py` dispatches to one module per subcommand."""

from .main import main

__all__ = ["main"]
