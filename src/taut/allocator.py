"""Memory that torch frees on a CPU stays in the process, for the next step to reuse.

torch takes CPU tensors from the C library's `malloc`. glibc's serves a large request (above
32 MB at most, less by default) with a mapping of its own, unmapped when freed, and gives the
top of its heap back to the kernel once it is free. A training step allocates and frees the same
large tensors every step (logits over the vocabulary, activations kept for the backward,
gradients), so each step asks the kernel for its pages again and takes a page fault per 4 KB page
it writes: on SmolLM2-135M 0.3–2 million faults per update. On this project's CPU machine, a
virtual machine that reports freed pages to its host, faulting them back in is slow, and keeping
them made the update 1.6–2.0× as fast (docs/performance-log.md, "Freed memory kept in the process").

`keep_freed_memory()` tells glibc to take every allocation from its heap and not to trim it:
freed memory goes back to malloc's free lists, not to the kernel. Once the heap has grown to a
step's peak, later steps fault nothing. The peak resident memory stays what it was; the memory
is held until the process ends. The setting lasts for the process: a policy loaded later with
`model.keep_freed_memory: false` does not undo it.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1           # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
NEVER_TRIM = -1                 # mallopt(3): -1 turns trimming off (2**31 - 1, the largest positive
                                # value, still trims a free top above 2 GB: TRL's steps free 4 GB at once)


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for the rest of the process (setting it again changes
    nothing); True where it does (Linux with glibc), False elsewhere, where nothing is changed."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt          # the process's own C library
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
