"""Where weights come from: offline packs (packs.py) and loading them on a backend (loader.py)."""
