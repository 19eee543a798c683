"""Give llama.cpp two run-time switches in a llama-cpp-python source tree, before it is built.

    python scripts/llama_cpp_switch.py SOURCE_DIR

Both serve `--exact` (docs/design.md, "Exactness on llama.cpp"); unset, llama.cpp runs as upstream.

- `GGML_CPU_LLAMAFILE`: llamafile's sgemm is llama.cpp's fastest CPU kernel for multi-token
  passes (prefill, long verification chunks), but it takes batches of 2+ tokens only, so a
  verified chunk rounds differently from one-token decoding and `--exact` cannot use it. Upstream
  it is a compile-time choice (GGML_LLAMAFILE). Read once per process like ggml's own
  `GGML_CPU_TILED_MM`, the variable turns the kernel off when atoi reads it as 0. llama.cpp's
  system info then lists `LLAMAFILE_SWITCH = 1`.
- `LLAMA_KV_CELL_ORDER`: flash attention sums a row over the cache in cell order, so a sequence
  rounds the same wherever its cells lie only while they lie in position order. Upstream places a
  pass's tokens in the first free cells from a moving head, which can be below a sequence's own
  cells once another sequence's rejected drafts are freed there. With the variable set (atoi not
  0), each token takes the lowest free cell above every cell its sequence already holds, and
  upstream's search is the fallback when none is free up there. The system info then starts with
  `KV_CELL_ORDER_SWITCH = 1`.

specserve tells this build from a stock one by those two entries, and refuses `--exact` where
they are missing (backends/llamacpp.py, `exactness_problem`).

Each edit is anchored on a line of the vendored source; if an anchor is missing (a new
llama-cpp-python release), this script fails loudly rather than build something unchecked.
"""

from __future__ import annotations

import sys
from pathlib import Path

CPU = "vendor/llama.cpp/ggml/src/ggml-cpu"
SRC = "vendor/llama.cpp/src"
MARK = "specserve: GGML_CPU_LLAMAFILE"
ORDER_MARK = "specserve: LLAMA_KV_CELL_ORDER"

# Placed at the top of llama_kv_cache::find_slot: a unified cache (one stream) and a non-contiguous
# search only, which is every pass's; `cont` and per-sequence streams keep upstream's search.
IN_ORDER_SLOT = r"""    // ORDER_MARK: each token takes the lowest free cell above every cell its sequence holds
    static const bool specserve_in_order = [] {
        const char * env = getenv("LLAMA_KV_CELL_ORDER");
        return env != NULL && atoi(env) != 0;
    }();
    if (specserve_in_order && n_stream == 1 && !cont) {
        const auto & cells = v_cells[0];
        const uint32_t size = cells.size();
        std::vector<int64_t> next_cell(LLAMA_MAX_SEQ, -1);  // next cell each sequence may take (-1: not yet found)
        std::vector<bool> taken(size, false);           // cells given to earlier tokens of this ubatch
        slot_info ordered = {};
        ordered.s0 = ordered.s1 = 0;
        ordered.resize(1);
        ordered.strm[0] = 0;
        ordered.idxs[0].reserve(ubatch.n_tokens);
        for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
            uint32_t lo = 0;
            for (int32_t k = 0; k < ubatch.n_seq_id[i]; ++k) {
                const llama_seq_id sid = ubatch.seq_id[i][k];
                if (next_cell[sid] < 0) {
                    next_cell[sid] = 0;
                    for (int64_t c = (int64_t) cells.used_max_p1() - 1; c >= 0; --c) {
                        if (!cells.is_empty(c) && cells.seq_has(c, sid)) {
                            next_cell[sid] = c + 1;
                            break;
                        }
                    }
                }
                lo = std::max<uint32_t>(lo, (uint32_t) next_cell[sid]);
            }
            while (lo < size && (taken[lo] || !cells.is_empty(lo))) {
                ++lo;
            }
            if (lo == size) {
                LLAMA_LOG_WARN("%s: no free cell above sequence %d's cells; placing this ubatch as upstream does\n",
                        __func__, ubatch.seq_id[i][0]);
                ordered.idxs[0].clear();
                break;
            }
            taken[lo] = true;
            ordered.idxs[0].push_back(lo);
            for (int32_t k = 0; k < ubatch.n_seq_id[i]; ++k) {
                next_cell[ubatch.seq_id[i][k]] = lo + 1;
            }
        }
        if (ordered.idxs[0].size() == ubatch.n_tokens) {
            return ordered;
        }
    }
""".replace("ORDER_MARK", ORDER_MARK)

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
    (
        f"{SRC}/llama-kv-cache.cpp",
        "llama_kv_cache::slot_info llama_kv_cache::find_slot(const llama_ubatch & ubatch, bool cont) const {\n",
        IN_ORDER_SLOT,
    ),
    (
        f"{SRC}/llama-kv-cache.cpp",
        "#include <cstring>\n",
        "#include <cstdlib>  // " + ORDER_MARK + "\n",
    ),
    (
        f"{SRC}/llama.cpp",
        "    s.clear(); // Clear the string, since it's static, otherwise it will accumulate data from previous"
        " calls.\n",
        '    s += "KV_CELL_ORDER_SWITCH = 1 | ";  // ' + ORDER_MARK + "\n",
    ),
]


def patch(root: Path) -> None:
    for rel, anchor, insert in EDITS:
        path = root / rel
        text = path.read_text()
        if anchor + insert in text:
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
