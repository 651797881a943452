"""A CPU policy's process keeps the memory torch frees, so a training step does not fault it in
again at every step (taut.allocator)."""

import json
import platform
import subprocess
import sys

import pytest

# Each phase frees and reallocates a 64 MB tensor four times: above glibc's largest mmap
# threshold (32 MB), so a plain process maps and unmaps it each time and writes 16,384 fresh
# pages; a process that keeps freed memory takes it back from malloc's free lists. Faults are
# counted, not timed. A fresh interpreter: the setting lasts for the process.
PROBE = """
import json, resource, torch
from taut.config import ModelConfig
from taut.models import load_policy

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        x = torch.ones(16 * 2**20)
        del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

out = {"plain": faults()}
load_policy(ModelConfig(preset="tiny", device="cpu", keep_freed_memory=False))
out["turned_off"] = faults()
load_policy(ModelConfig(preset="tiny", device="cpu"))
faults()                                  # the heap grows to the tensor's size once
out["kept"] = faults()
print(json.dumps(out))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_cpu_policy_keeps_freed_memory_so_reallocating_it_faults_nothing():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    faults = json.loads(result.stdout.strip().splitlines()[-1])
    pages = 4 * 16 * 2**20 * 4 // 4096                       # 65,536 pages written per phase
    assert faults["plain"] > pages // 2 and faults["turned_off"] > pages // 2
    assert faults["kept"] < pages // 50
