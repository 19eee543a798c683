"""The `specserve` command: `main.py` dispatches to one module per subcommand."""
