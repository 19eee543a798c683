"""Where weights come from: offline packs (registry.py lists them, packs.py pulls them) and loading
them on a backend (loader.py, with gguf_reads.py: a GGUF file read once while transformers loads it)."""
