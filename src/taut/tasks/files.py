"""Tasks read from data files: JSONL, Parquet, CSV, or a `datasets` dataset saved on disk.

A `FileTaskConfig` names the file, its format (`auto`: from the suffix; a directory is a
`datasets` dataset saved with `save_to_disk`) and a `ColumnMap` saying which column holds the
prompt, the reference answer and, optionally, a worked response (for SFT), a domain, a
difficulty and a stable id.

Every row is validated when the task is loaded; the first bad row stops loading with an error
naming the file, the line (JSONL, CSV) or row number (Parquet, datasets), the field and what
was expected. Values are never rewritten: a prompt is used exactly as stored (an integer answer
or id becomes its decimal string; a CSV difficulty is read as an integer).

Splits. A file may declare the split it holds (`split: test`); a saved `DatasetDict` declares
one per key (`train`, `validation`, `test`). Otherwise each row is assigned to train /
validation / test (70 / 10 / 20 %) by a stable hash of its id column, or of its prompt when
there is no id column — so reordering the file, or repeating a prompt, never moves a problem
across splits.

Problems are grouped by (domain, difficulty) when those columns are mapped; `problems(split,
n_per_level, seed)` returns up to n per group (a seeded sample, in file order). Problem ids are
`<task name>:<id column>` or `<task name>:row-<n>`.

Text files (JSONL, CSV) must be UTF-8: other bytes are an error naming the file and line.

Prompt length. One giant prompt is enough to exhaust memory in generation, so a task given a
`PromptLimit` (`data.max_prompt_tokens`, by default the model's context minus the rollout cap)
skips the rows whose prompt is longer, and warns once with how many it skipped and where the
first one is; it is an error only when no row is left. Skipping rather than refusing the file:
a large scraped data set with a few broken rows still trains, and the warning says where they
are. Rows keep their numbers (ids `row-<n>` do not shift). The prompt's own tokens are counted,
not a chat template's. Without a tokenizer the bound is on characters instead:
`CHARS_PER_TOKEN_BOUND` characters per allowed token, a loose bound (English text averages about
4 characters per token) that only catches prompts that are certainly far too long.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taut.config import FileTaskConfig
from taut.tasks import math
from taut.tasks.base import (  # noqa: F401 (re-exported)
    BUDGET_INSTRUCTION,
    CHARS_PER_TOKEN_BOUND,
    SPLITS,
    Problem,
    PromptLimit,
    Split,
    Verdict,
    check_split,
    split_of,
)

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A data file that cannot be used as it is; the message names file, line/row and field."""


@dataclass(frozen=True)
class Row:
    where: str                  # "path:LINE" or "path row N": for messages
    index: int                  # 1-based position among the file's rows
    prompt: str
    answer: str
    response: str | None
    domain: str | None
    difficulty: int | None
    id: str | None
    split: Split


# ---------------------------------------------------------------------------------------------
# reading and validating
# ---------------------------------------------------------------------------------------------


BUILTIN = "builtin:"
SHIPPED_DATA = Path(__file__).resolve().parent.parent / "data"      # src/taut/data: data files taut ships


def data_path(spec: str) -> Path:
    """The file a task's `path` names: `builtin:<name>` is a file taut ships (`builtin:math-tiny.jsonl`),
    anything else a path, a relative one read from the current directory."""
    return SHIPPED_DATA / spec.removeprefix(BUILTIN) if spec.startswith(BUILTIN) else Path(spec)


def _missing(config: FileTaskConfig) -> FileNotFoundError:
    if config.path.startswith(BUILTIN):
        shipped = ", ".join(BUILTIN + p.name for p in sorted(SHIPPED_DATA.glob("*.jsonl")))
        return FileNotFoundError(f"no built-in data file {config.path!r}; built-in data files: {shipped or 'none'}")
    where = "" if Path(config.path).is_absolute() else f" (a relative path is read from the current directory, {Path.cwd()})"
    return FileNotFoundError(f"data file {config.path!r} does not exist{where}")


def resolve_format(config: FileTaskConfig) -> str:
    path = data_path(config.path)
    if not path.exists():
        raise _missing(config)
    if config.format != "auto":
        return config.format
    if path.is_dir():
        return "datasets"
    if path.suffix.lower() in FORMATS:
        return FORMATS[path.suffix.lower()]
    raise DataError(f"{config.path}: cannot tell the format from the suffix {path.suffix!r}; "
                    f"set format to one of jsonl, parquet, csv, datasets")


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (json.loads keeps the last of a repeated key)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _records(path: Path, fmt: str) -> Iterator[tuple[str, Any, Split | None]]:
    """(location, record, split declared by the source) for every row, in file order."""
    if fmt == "jsonl":
        with open(path, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                where = f"{path}:{line_no}"
                line = _decode(raw, where)
                if not line.strip():
                    continue
                try:
                    record = json.loads(line, object_pairs_hook=_unique_keys)
                except json.JSONDecodeError as err:
                    raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
                except _DuplicateKey as err:
                    raise DataError(f"{where}: field {err.args[0]!r} is given twice in the row; keep one") from None
                yield where, record, None
    elif fmt == "csv":
        _check_utf8(path)
        with open(path, encoding="utf-8-sig", newline="") as f:       # -sig: spreadsheets write a BOM
            reader = csv.DictReader(f, restkey="\0extra")
            start = 2                                      # line 1 is the header
            for record in reader:
                where = f"{path}:{start}"
                start = reader.line_num + 1
                if "\0extra" in record:
                    raise DataError(f"{where}: more fields than the header's {len(reader.fieldnames or [])}")
                yield where, record, None
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path} row {i}", record, None
    elif fmt == "datasets":
        from datasets import DatasetDict, load_from_disk

        data = load_from_disk(str(path))
        parts = data.items() if isinstance(data, DatasetDict) else [(None, data)]
        for key, dataset in parts:
            if key is not None and key not in SPLITS:
                raise DataError(f"{path}: split {key!r} of the saved DatasetDict is not one of {', '.join(SPLITS)}")
            for i, record in enumerate(dataset, start=1):
                yield (f"{path} row {i}" if key is None else f"{path} [{key}] row {i}"), record, key
    else:
        raise DataError(f"{path}: unknown format {fmt!r}; valid formats: jsonl, parquet, csv, datasets")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line); "
                        f"re-encode the file as UTF-8") from None


def _check_utf8(path: Path) -> None:
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            _decode(raw, f"{path}:{line_no}")


def read_rows(config: FileTaskConfig) -> list[Row]:
    """Every row of a data file, validated (`DataError` at the first bad one)."""
    fmt = resolve_format(config)
    path = data_path(config.path)
    cols = config.columns
    rows: list[Row] = []
    seen_ids: dict[str, str] = {}
    for where, record, declared in _records(path, fmt):
        if declared is not None and config.split is not None:
            raise DataError(f"{path}: a saved DatasetDict declares its splits by its keys; remove `split` from the task")
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected an object with fields, got {_show(record)}")
        field = _Fields(record, where)
        prompt = field.text("prompt", cols.prompt)
        answer = field.answer(cols.answer)
        response = field.text("response", cols.response) if cols.response else None
        domain = field.text("domain", cols.domain) if cols.domain else None
        difficulty = field.integer("difficulty", cols.difficulty) if cols.difficulty else None
        row_id = field.identifier(cols.id) if cols.id else None
        if row_id is not None:
            if row_id in seen_ids:
                raise DataError(f"{where}: field {cols.id!r}: id {row_id!r} is already used at {seen_ids[row_id]}")
            seen_ids[row_id] = where
        split = config.split or declared or split_of(row_id if row_id is not None else prompt)
        rows.append(Row(where, len(rows) + 1, prompt, answer, response, domain, difficulty, row_id, split))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


class _Fields:
    """Typed access to one record's fields; every failure names the place and the field."""

    def __init__(self, record: dict, where: str):
        self.record, self.where = record, where

    def _get(self, column: str, role: str) -> Any:
        if column not in self.record:
            present = ", ".join(map(str, list(self.record)[:12]))
            raise DataError(f"{self.where}: missing field {column!r} (the {role} column, columns.{role}); "
                            f"the row has: {present}")
        return self.record[column]

    def _fail(self, column: str, expected: str, value: Any) -> DataError:
        return DataError(f"{self.where}: field {column!r}: expected {expected}, got {_show(value)}")

    def text(self, role: str, column: str) -> str:
        value = self._get(column, role)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(column, "a non-empty string", value)
        return value

    def answer(self, column: str) -> str:
        value = self._get(column, "answer")
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, float):
            raise self._fail(column, "a string or an integer (store non-integer answers as strings so their exact form is kept)", value)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(column, "a non-empty string", value)
        return value

    def integer(self, role: str, column: str) -> int:
        value = self._get(column, role)
        if isinstance(value, bool):
            raise self._fail(column, "an integer", value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise self._fail(column, "an integer", value)

    def identifier(self, column: str) -> str:
        value = self._get(column, "id")
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(column, "a non-empty string or an integer", value)
        return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{text[:80]}{'…' if len(text) > 80 else ''} ({type(value).__name__})"


_CACHE: dict[tuple, list[Row]] = {}


def cached_rows(config: FileTaskConfig) -> list[Row]:
    """`read_rows`, remembered while the file is unchanged (tasks are loaded by several stages)."""
    path = data_path(config.path)
    if not path.exists():
        raise _missing(config)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    key = (str(path.resolve()), stamp, config.model_dump_json())
    if key not in _CACHE:
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = read_rows(config)
    return _CACHE[key]


# ---------------------------------------------------------------------------------------------
# the task
# ---------------------------------------------------------------------------------------------


class FileTask:
    """Problems from a data file, graded by the math verifier or by exact match."""

    def __init__(self, config: FileTaskConfig, levels: list[int] | tuple[int, ...] | None = None,
                 prompt_limit: PromptLimit | None = None):
        if config.verifier == "math" and importlib.util.find_spec("math_verify") is None:
            raise ImportError(f"task {config.path!r} uses the math verifier: install the math extra (pip install 'taut[math]')")
        self.config = config
        self.name = config.name or data_path(config.path).stem
        rows = cached_rows(config)
        if levels:
            if config.columns.difficulty is None:
                raise ValueError(f"data.levels is set but task {self.name!r} has no difficulty column: "
                                 f"map columns.difficulty or unset data.levels")
            wanted = set(levels)
            rows = [r for r in rows if r.difficulty in wanted]
        self.skipped_long: list[str] = []          # where each over-long prompt is (file:line)
        if prompt_limit is not None:
            rows = self._within(rows, prompt_limit)
        self.rows = rows

    def _within(self, rows: list[Row], limit: PromptLimit) -> list[Row]:
        kept = []
        for row in rows:
            if limit.too_long(row.prompt):
                self.skipped_long.append(row.where)
            else:
                kept.append(row)
        if self.skipped_long:
            if not kept:
                raise DataError(f"{self.config.path}: every prompt is longer than {limit.describe()}, the first at "
                                f"{self.skipped_long[0]}; raise data.max_prompt_tokens or shorten the prompts")
            log.warning("%s: skipped %d of %d rows whose prompt is longer than %s; the first: %s", self.config.path,
                        len(self.skipped_long), len(rows), limit.describe(), self.skipped_long[0])
        return kept

    # ---- problems ---------------------------------------------------------------------
    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        groups: dict[tuple[str, int | None], list[Row]] = {}
        for row in self.rows:
            if row.split == split:
                groups.setdefault((row.domain or self.name, row.difficulty), []).append(row)
        out = []
        for (domain, difficulty), members in groups.items():
            if len(members) > n_per_level:
                rng = random.Random(f"{seed}:{self.name}:{domain}:{difficulty}:{split}")
                members = sorted(rng.sample(members, n_per_level), key=lambda r: r.index)
            out += [self._problem(r, domain) for r in members]
        return out

    def _problem(self, row: Row, domain: str) -> Problem:
        local = row.id if row.id is not None else f"row-{row.index}"
        return Problem(id=f"{self.name}:{local}", prompt=row.prompt, answer=row.answer, domain=domain,
                       difficulty=row.difficulty, held_out=self.config.held_out, data=row)

    def sft_pairs(self, split: Split = "train") -> list[tuple[str, str]]:
        """(prompt, response) of every row of a split (train: the SFT data this file provides)."""
        if self.config.columns.response is None:
            raise ValueError(f"SFT on {self.name!r} needs worked responses: set columns.response to the column that holds them")
        pairs = [(r.prompt, r.response) for r in self.rows if r.split == split]
        if not pairs and split == "train":
            raise ValueError(f"{self.name!r} has no train-split rows to fine-tune on (split: {self.config.split})")
        return pairs

    # ---- grading ----------------------------------------------------------------------
    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        if self.config.verifier == "math":
            return math.verify(response, problem.answer, complete)
        extracted = math.extract_answer(response, complete)
        return Verdict(correct=extracted is not None and math.normalize(extracted) == math.normalize(problem.answer),
                       extracted=extracted)

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")
