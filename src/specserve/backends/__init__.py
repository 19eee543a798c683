"""Model execution backends behind one multi-sequence Protocol (see base.py).

`transformers` runs Hugging Face models in torch (exact f32 reference, GPUs through torch);
`llama.cpp` runs GGUF files as they are (quantized kernels for every CPU, GPU builds too).
"""

from ..config import BACKENDS
from .base import Backend, Runner, RunnerBackend, SeqInput, SequenceRunner, as_backend

__all__ = ["BACKENDS", "Backend", "Runner", "RunnerBackend", "SeqInput", "SequenceRunner", "as_backend"]
