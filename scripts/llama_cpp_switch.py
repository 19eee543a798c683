"""Give llamafile's sgemm a run-time switch in a llama-cpp-python source tree, before it is built.

    python scripts/llama_cpp_switch.py SOURCE_DIR

llamafile's sgemm is llama.cpp's fastest CPU kernel for multi-token passes (prefill, long
verification chunks), but it takes batches of 2+ tokens only, so a verified chunk rounds
differently from one-token decoding and `--exact` cannot use it. Upstream it is a compile-time
choice (GGML_LLAMAFILE). With this change one build serves both modes:

- `GGML_CPU_LLAMAFILE`, read once per process like ggml's own `GGML_CPU_TILED_MM`, turns the
  kernel off when atoi reads it as 0 (exact mode sets it; unset, the kernel runs as upstream);
- llama.cpp's system info lists `LLAMAFILE_SWITCH = 1`, so specserve can tell this build from a
  stock one, where `--exact` must be refused (backends/llamacpp.py, `exactness_problem`).

Each edit is anchored on a line of the vendored source; if an anchor is missing (a new
llama-cpp-python release), this script fails loudly rather than build something unchecked.
"""

from __future__ import annotations

import sys
from pathlib import Path

CPU = "vendor/llama.cpp/ggml/src/ggml-cpu"
MARK = "specserve: GGML_CPU_LLAMAFILE"

EDITS = [
    (
        f"{CPU}/llamafile/sgemm.cpp",
        "    assert(params->ith < params->nth);\n",
        "    // " + MARK + "=0 turns this kernel off at run time (read once, like GGML_CPU_TILED_MM)\n"
        "    static const bool specserve_sgemm_on = [] {\n"
        '        const char * env = getenv("GGML_CPU_LLAMAFILE");\n'
        "        return env == NULL || atoi(env) != 0;\n"
        "    }();\n"
        "    if (!specserve_sgemm_on)\n"
        "        return false;\n",
    ),
    (
        f"{CPU}/ggml-cpu.cpp",
        '            features.push_back({ "LLAMAFILE", "1" });\n',
        '            features.push_back({ "LLAMAFILE_SWITCH", "1" });  // ' + MARK + "\n",
    ),
]


def patch(root: Path) -> None:
    for rel, anchor, insert in EDITS:
        path = root / rel
        text = path.read_text()
        if MARK in text:
            continue  # already patched
        if text.count(anchor) != 1:
            sys.exit(f"llama_cpp_switch: expected one {anchor.strip()!r} in {path}; this release needs a new patch")
        path.write_text(text.replace(anchor, anchor + insert))
    sgemm = root / EDITS[0][0]
    if "#include <cstdlib>" not in sgemm.read_text():
        text = sgemm.read_text()
        sgemm.write_text(text.replace("#include <array>\n", "#include <array>\n#include <cstdlib>\n", 1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: llama_cpp_switch.py SOURCE_DIR")
    patch(Path(sys.argv[1]))
