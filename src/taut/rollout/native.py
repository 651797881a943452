"""taut's compiled decode kernels (kernels/decode_attention.cpp), built on first use.

The elementwise work of the fast path's decode step under bf16 autocast, fused:

- `decode_attention`: rotary on the new query and key heads, the new key and value written into
  the bf16 cache, and single-query attention over the cache for every row and key/value head
  (its query heads sharing each key and value read), fp32 arithmetic on bf16 inputs (queries
  rounded to bf16 after the rotary, as the keys are). It replaces, per layer, the rotary kernels,
  two cache writes and `scaled_dot_product_attention`'s CPU flash kernel, which spends most of a
  step on two tiny oneDNN products per row and head (docs/performance-log.md, "How close generation
  can come under its exactness test").
- `decode_attention_shared`: the same with the prompt's columns in one buffer per prompt, which
  the rows sampled from it share (the same step bit for bit, the prompt read once a group).
- `add_rms_norm`: the residual add, the next RMS norm and its cast to bf16 in one pass.
- `silu_mul`: SiLU of the gate times `up`, in one pass.

They round differently from Hugging Face's kernels, so the fast path takes them only under bf16
autocast, where it is held to the decode contract (taut.rollout.contract); fp32 keeps sdpa and
its greedy tokens equal to `model.generate`.

The extension is compiled with torch's C++ extension builder (a C++ compiler and ninja; the
`ninja` package is a dependency) into torch's extension cache, keyed by the source's hash, once
per machine (about 45 s on 2 cores). Without a compiler, or with `TAUT_NATIVE=0`, `kernel()`
returns None and the fast path keeps its torch steps; `reason()` says why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "decode_attention.cpp"
# -ffast-math: vectorised exp (the kernel never relies on inf or NaN arithmetic); -fopenmp: without
# it at::parallel_for, inlined from torch's headers, runs on one thread
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
ENV = "TAUT_NATIVE"                                 # 0: never build or use the kernel

_lock = threading.Lock()
_state: dict[str, object] = {}


def kernel():
    """The compiled module (its `decode_attention` function), or None when it cannot be had."""
    with _lock:
        if "module" not in _state:
            _state["module"], _state["reason"] = _build()
        return _state["module"]


def reason() -> str | None:
    """Why `kernel()` is None (None when it is not, or before the first call)."""
    return _state.get("reason")  # type: ignore[return-value]


def _build():
    if os.environ.get(ENV, "1") == "0":
        return None, f"{ENV}=0"
    try:
        from torch.utils.cpp_extension import load

        _ninja_on_path()
        source = SOURCE.read_bytes()
        name = "taut_decode_attention_" + hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:12]
        log.info("compiling taut's decode kernel (once per machine)")
        module = load(name=name, sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], verbose=False)
        return module, None
    except Exception as error:                    # no compiler, no ninja, a failed build: sdpa it is
        message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        log.warning("taut's decode kernel is unavailable (%s); the fast path uses sdpa", message)
        return None, message


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH: put the `ninja` package's binary there (a
    virtual environment's bin is not on PATH when its programs are run by their full path)."""
    try:
        import ninja
    except ImportError:
        return
    directory = getattr(ninja, "BIN_DIR", None)
    if directory and directory not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = directory + os.pathsep + os.environ.get("PATH", "")
