"""Model execution backends behind one multi-sequence Protocol (see base.py).

`transformers` runs Hugging Face models in torch (exact f32 reference, GPUs through torch);
`llama.cpp` runs GGUF files as they are (quantized kernels for every CPU, GPU builds too).

base.py          the Backend and Runner Protocols, SeqInput, and a Runner wrapped as a Backend
transformers.py  a Hugging Face causal LM in torch, one DynamicCache per sequence
llamacpp.py      GGUF through llama-cpp-python's low-level API, one unified KV cache
compute.py       the one thread every model computation runs on (OpenMP's thread pools)
row_buffers.py   reused float32 blocks the llama.cpp backend's logits rows land in
"""

from ..config import BACKENDS
from .base import Backend, Runner, RunnerBackend, SeqInput, SequenceRunner, as_backend

__all__ = ["BACKENDS", "Backend", "Runner", "RunnerBackend", "SeqInput", "SequenceRunner", "as_backend"]
