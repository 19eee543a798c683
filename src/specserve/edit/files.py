"""The file side of an edit: which language a path holds, and writing the result safely."""

from __future__ import annotations

import os
from pathlib import Path

LANGUAGES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".js": "javascript",
    ".jsx": "jsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".rb": "ruby",
    ".php": "php",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".cs": "csharp",
    ".kt": "kotlin",
    ".swift": "swift",
    ".sql": "sql",
    ".sh": "bash",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".md": "markdown",
    ".html": "html",
    ".css": "css",
}


def language_for(path: str | Path | None) -> str:
    return LANGUAGES.get(Path(path).suffix.lower(), "") if path else ""


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: never a half-written file."""
    tmp = path.with_name(f".{path.name}.specserve-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
