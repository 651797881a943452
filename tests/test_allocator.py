"""A CPU policy's process keeps the memory torch frees, so a training step does not fault it in
again at every step (taut.allocator)."""

import json
import os
import platform
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
glibc_only = pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")

# The probes run in fresh interpreters (the settings last for a process). Faults are counted in
# 4 KB pages unless a test asks for huge pages: a test that runs `taut sft` in this process leaves
# THP_MEM_ALLOC_ENABLE in its environment (taut.allocator.ask_huge_pages).
UNASKED = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
SMALL_PAGES = {**UNASKED, "THP_MEM_ALLOC_ENABLE": "0"}

# faults(floats): the minor page faults of allocating, writing and freeing a tensor four times
FAULTS = """
import json, resource, sys, torch
from taut.config import ModelConfig
from taut.models.loading import load_policy

def faults(floats):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        x = torch.ones(floats)
        del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""


def probe(code: str, *args: str, env: dict[str, str] | None = None):
    """Run `code` in a fresh interpreter; the JSON it prints last."""
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])

# Each phase frees and reallocates a 64 MB tensor four times: above glibc's largest mmap
# threshold (32 MB), so a plain process maps and unmaps it each time and writes 16,384 fresh
# pages; a process that keeps freed memory takes it back from malloc's free lists. Faults are
# counted, not timed.
PROBE = FAULTS + """
out = {"plain": faults(16 * 2**20)}
load_policy(ModelConfig(preset="tiny", device="cpu", keep_freed_memory=False))
out["turned_off"] = faults(16 * 2**20)
load_policy(ModelConfig(preset="tiny", device="cpu"))
faults(16 * 2**20)                        # the heap grows to the tensor's size once
out["kept"] = faults(16 * 2**20)
print(json.dumps(out))
"""


@glibc_only
def test_a_cpu_policy_keeps_freed_memory_so_reallocating_it_faults_nothing():
    faults = probe(PROBE, env=SMALL_PAGES)
    pages = 4 * 16 * 2**20 * 4 // 4096                       # 65,536 pages written per phase
    assert faults["plain"] > pages // 2 and faults["turned_off"] > pages // 2
    assert faults["kept"] < pages // 50


# A step that frees more than 2 GB at the top of the heap at once (TRL's steps on SmolLM2 free
# 4 GB) must not hand it back either: glibc trims a free top above the trim threshold, and the
# largest positive threshold mallopt takes is 2 GB. The probe takes and frees 2.5 GB three times
# through malloc itself (no other allocation in between, pages untouched) and reads the program
# break: a kept heap grows once, a trimmed one shrinks after every free and grows again.
TRIM_PROBE = """
import ctypes, json
from taut.config import ModelConfig
from taut.models.loading import load_policy

load_policy(ModelConfig(preset="tiny", device="cpu"))
libc = ctypes.CDLL(None)
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
start, grown = libc.sbrk(0), []
for _ in range(3):
    before = libc.sbrk(0)
    libc.free(libc.malloc(5 * 2**29))
    grown.append(libc.sbrk(0) - before)
print(json.dumps({"grown": grown, "kept": libc.sbrk(0) - start}))
"""


@glibc_only
def test_a_free_top_above_two_gigabytes_is_kept_too():
    heap = probe(TRIM_PROBE)
    size = 5 * 2**29
    assert heap["kept"] > size * 0.9           # the freed 2.5 GB is still the process's (free heap below may serve a little)
    assert heap["grown"][1:] == [0, 0]                        # and later requests take it from there


# Given back means given back: glibc's default mmap threshold rises to each freed mapped block's
# size (up to 32 MB), after which a 16 MB tensor comes from the heap and, freed, stays resident.
# With model.keep_freed_memory false the threshold is fixed (taut.allocator.return_freed_memory):
# each 16 MB tensor is mapped afresh and unmapped when freed. Faults are counted, not timed.
RETURN_PROBE = FAULTS + """
if sys.argv[1] == "returned":
    load_policy(ModelConfig(preset="tiny", device="cpu", keep_freed_memory=False))
faults(4 * 2**20)                         # the default's threshold rises, its heap grows
print(json.dumps(faults(4 * 2**20)))
"""
TENSOR_PAGES = 16 * 2**20 // 4096                          # 4,096 pages a 16 MB tensor


@glibc_only
def test_a_policy_that_gives_freed_memory_back_maps_every_large_tensor_afresh():
    assert probe(RETURN_PROBE, "plain", env=SMALL_PAGES) < TENSOR_PAGES             # the default: the heap keeps it
    assert probe(RETURN_PROBE, "returned", env=SMALL_PAGES) > 3.5 * TENSOR_PAGES   # each of the four mapped, given back


def test_sft_gives_freed_memory_back_unless_told_and_the_other_commands_keep_it():
    from taut.config import ModelConfig

    unset = ModelConfig(preset="tiny")
    assert unset.keeps_freed_memory("sft") is False and unset.keeps_freed_memory("train") is True
    for value in (True, False):
        told = ModelConfig(preset="tiny", keep_freed_memory=value)
        assert told.keeps_freed_memory("sft") is value and told.keeps_freed_memory("train") is value


# `taut sft` asks torch for transparent huge pages (its THP_MEM_ALLOC_ENABLE, read at its first
# allocation; taut.allocator.ask_huge_pages): memory given back and allocated again faults 2 MB
# pages in, a 16 MB tensor in 8 faults rather than 4,096. Where the kernel offers no huge pages
# the test is skipped; an environment that says 0 keeps its choice.
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_available() -> bool:
    try:
        with open(THP) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not GLIBC or not _thp_available(), reason="glibc and transparent huge pages only")
def test_asked_for_before_torch_huge_pages_make_given_back_memory_cheap_to_fault_in():
    asking = "from taut.allocator import ask_huge_pages\nassert ask_huge_pages()\n" + RETURN_PROBE
    assert probe(asking, "returned", env=UNASKED) < TENSOR_PAGES                  # 4 × 4,096 on small pages
    assert probe(asking, "returned", env=SMALL_PAGES) > 3.5 * TENSOR_PAGES        # the environment's 0 is kept


# The sft command asks before anything has imported torch: its configuration is where torch first
# comes in, so the probe stops the command there and reports what it found.
SFT_ASKS = """
import json, os, sys
import taut.cli

def stop(*args, **kwargs):
    print(json.dumps({"asked": os.environ.get("THP_MEM_ALLOC_ENABLE"), "torch": "torch" in sys.modules}))
    raise SystemExit(0)

taut.cli._config = stop
taut.cli.app(["sft"], standalone_mode=False)
"""


def test_the_sft_command_asks_for_huge_pages_before_torch_is_imported():
    assert probe(SFT_ASKS, env=UNASKED) == {"asked": "1", "torch": False}
