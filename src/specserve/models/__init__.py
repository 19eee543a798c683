"""Where weights come from: offline packs (packs.py) and loading them on a backend (loader.py,
with gguf_reads.py: a GGUF file read once while transformers loads it)."""
