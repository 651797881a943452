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

`return_freed_memory()` (`model.keep_freed_memory: false`) is the other way: every block of 1 MB
or more gets a mapping of its own, unmapped when freed. glibc's default is not that: its mmap
threshold rises to the size of each mapped block freed, up to 32 MB, after which blocks below it
come from the heap and stay there, fragmented. On SmolLM2, an SFT step of 16 × 512 tokens (full
fine-tuning, bf16 autocast, activation checkpointing) holds 3.6 GB of live tensors at its peak;
`taut sft` at 16 × 486 peaked at 5.2 GB giving memory back, 7.1 GB under glibc's default, and
passed 7.5 GB by its third step keeping it (docs/real-models.md, "SFT from files"). Memory given
back costs a page fault per page a large tensor writes when allocated again; `taut sft` asks torch
for 2 MB pages (`ask_huge_pages`), which makes that cheap.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1           # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
RETURN_FROM = 2**20             # bytes: blocks this large or larger are mapped and unmapped (return_freed_memory)
NEVER_TRIM = -1                 # mallopt(3): -1 turns trimming off (2**31 - 1, the largest positive
                                # value, still trims a free top above 2 GB: TRL's steps free 4 GB at once)


_kept = False


def _mallopt():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    mallopt = ctypes.CDLL(None).mallopt          # the process's own C library
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


def ask_huge_pages() -> bool:
    """Ask torch to put CPU tensors of 2 MB and more on transparent huge pages (its
    `THP_MEM_ALLOC_ENABLE`, which it reads once, at its first allocation), unless the environment
    already says: memory given back and allocated again then faults 2 MB pages in, not 4 KB ones —
    an SFT step of SmolLM2 ran at 107 tokens/s against 80 without (docs/real-models.md, "SFT from
    files"). True where the request can still take effect (torch not yet imported). `taut sft` asks;
    the other commands, which keep freed memory, were measured without it and do not."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return "torch" not in sys.modules


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for the rest of the process (setting it again changes
    nothing); True where it does (Linux with glibc), False elsewhere, where nothing is changed."""
    global _kept
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _kept = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    return _kept


def return_freed_memory() -> bool:
    """Make glibc's malloc map every block of `RETURN_FROM` bytes or more on its own and unmap it
    when freed, at a fixed threshold, and trim a free heap top above twice that; True where it
    does. Nothing changes where it cannot (not glibc) or where the process already keeps freed
    memory (`keep_freed_memory` lasts for the process)."""
    mallopt = _mallopt()
    if mallopt is None or _kept:
        return False
    return mallopt(M_MMAP_THRESHOLD, RETURN_FROM) == 1 and mallopt(M_TRIM_THRESHOLD, 2 * RETURN_FROM) == 1
