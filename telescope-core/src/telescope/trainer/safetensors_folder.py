"""Hugging Face weight folders, read tensor by tensor (or slice by slice) and written tensor by tensor.

A Hugging Face folder holds its weights either in one ``model.safetensors`` or in
several ``model-0000N-of-0000M.safetensors`` named by ``model.safetensors.index.json``
(``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``). Every reader of
weights in Telescope (checkpoint loading, ``telescope convert-checkpoint``, the
megatron backend's sharded set-up) goes through :class:`FolderReader`, so each accepts
both layouts.

Reading: :class:`FolderReader` opens each file with ``safetensors.safe_open`` (a memory
map; nothing is read until asked) and hands out whole tensors or slices
(``get_slice(name)[index]``), which read only the bytes of the rows asked for. It
counts the elements it has returned (:attr:`FolderReader.elements_read`) and records
every request, so a test can show what a rank read.

Writing: a safetensors file is an 8-byte header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes. When every tensor's name,
dtype and shape are known in advance (they are: a model's shapes do not depend on
its values), :class:`StreamWriter` writes the header first and then the tensors one
at a time as they are produced, so a writer never holds more than the tensor it is
writing. Files read back with ``safetensors.safe_open``, ``load_file`` and
``from_pretrained``. Limits: the tensors must arrive in the announced order, and
only the dtypes of :data:`SAFETENSORS_DTYPES` are written.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

#: torch dtype -> the safetensors header's name for it.
SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}

#: One tensor of a file to write: its name, dtype and shape.
Entry = tuple[str, torch.dtype, tuple[int, ...]]


def shard_file_name(index: int, count: int) -> str:
    """The Hugging Face name of shard ``index`` (from 0) of ``count``; ``model.safetensors`` when alone."""
    return SINGLE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def has_weights(folder: Path) -> bool:
    """Whether ``folder`` holds safetensors weights in either layout."""
    return (folder / SINGLE).is_file() or (folder / INDEX).is_file()


def weight_files(folder: Path) -> dict[str, str]:
    """Each weight's name -> the file (relative to ``folder``) that holds it, from the index or the single file."""
    from safetensors import safe_open

    index = folder / INDEX
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return dict(weight_map)
    single = folder / SINGLE
    if not single.is_file():
        raise FileNotFoundError(f"{folder}: no {SINGLE} and no {INDEX}; not a Hugging Face weights folder")
    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), SINGLE)


class FolderReader:
    """Tensors and slices of tensors of a weights folder (either layout), read on demand; a context manager.

    Files are opened when first needed and stay open (memory-mapped) until :meth:`close`.
    """

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self.files = weight_files(self.folder)
        self._open: dict[str, Any] = {}
        #: Elements returned so far, and each request as ``(name, index)`` (``None``: the whole tensor).
        self.elements_read = 0
        self.requests: list[tuple[str, Any]] = []

    def __enter__(self) -> FolderReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def names(self) -> list[str]:
        return list(self.files)

    def _handle(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"{self.folder}: no weight {name!r}")
        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(str(self.folder / file), framework="pt").__enter__()
        return self._open[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor ``name``."""
        tensor: torch.Tensor = self._handle(name).get_tensor(name)
        self.requests.append((name, None))
        self.elements_read += tensor.numel()
        return tensor

    def slice(self, name: str, index: Any) -> torch.Tensor:
        """``tensor[index]`` for basic indexing (ints and slices), reading only those elements."""
        tensor: torch.Tensor = self._handle(name).get_slice(name)[index]
        self.requests.append((name, index))
        self.elements_read += tensor.numel()
        return tensor


def load_folder(folder: Path | str) -> dict[str, torch.Tensor]:
    """Every tensor of a weights folder (either layout): the whole model in memory; for small models and tests."""
    with FolderReader(folder) as reader:
        return {name: reader.tensor(name) for name in reader.names()}


class StreamWriter:
    """One safetensors file written tensor by tensor: the header from ``entries``, then each tensor in order."""

    def __init__(self, path: Path | str, entries: list[Entry], metadata: dict[str, str] | None = None) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
        offset = 0
        for name, dtype, shape in entries:
            if dtype not in SAFETENSORS_DTYPES:
                raise ValueError(f"{name}: dtype {dtype} cannot be written to safetensors")
            size = _nbytes(dtype, shape)
            header[name] = {
                "dtype": SAFETENSORS_DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.path = Path(path)
        self._entries = list(entries)
        self._next = 0
        self._file = self.path.open("wb")
        self._file.write(struct.pack("<Q", len(text)) + text)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor``, which must be the next announced entry (same name, dtype and shape)."""
        if self._next >= len(self._entries):
            raise ValueError(f"{self.path}: {name!r} was not announced (every entry is written)")
        want = self._entries[self._next]
        got = (name, tensor.dtype, tuple(tensor.shape))
        if got != want:
            raise ValueError(f"{self.path}: expected {want} next, got {got}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        if data.numel():
            self._file.write(data.view(torch.uint8).numpy().data)  # no copy
        self._next += 1

    def close(self, *, check: bool = True) -> None:
        """Close the file; with ``check``, raise if an announced tensor was never written."""
        self._file.close()
        if check and self._next != len(self._entries):
            raise ValueError(f"{self.path}: {len(self._entries) - self._next} announced tensors were not written")


def write_file(path: Path | str, entries: list[Entry], tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Write ``tensors`` (in the order of ``entries``) as one safetensors file, one at a time."""
    writer = StreamWriter(path, entries)
    try:
        for name, tensor in tensors:
            writer.write(name, tensor)
    except BaseException:
        writer.close(check=False)
        raise
    writer.close()


def write_index(folder: Path, weight_map: dict[str, str], total_size: int) -> None:
    """``model.safetensors.index.json`` for a sharded folder."""
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")


def plan_shards(entries: list[Entry], max_bytes: int) -> list[list[Entry]]:
    """Consecutive runs of ``entries`` of at most ``max_bytes`` each (a larger tensor alone in its run)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for entry in entries:
        nbytes = _nbytes(entry[1], entry[2])
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    return shards


def entries_size(entries: Iterable[Entry]) -> int:
    """The bytes of the tensors of ``entries``."""
    return sum(_nbytes(dtype, shape) for _, dtype, shape in entries)


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * torch.empty((), dtype=dtype).element_size()


def iter_files(reader: FolderReader) -> Iterator[tuple[str, list[str]]]:
    """Each file of the folder (sorted) with the names it holds, in the index's order."""
    by_file: dict[str, list[str]] = {}
    for name, file in reader.files.items():
        by_file.setdefault(file, []).append(name)
    for file in sorted(by_file):
        yield file, by_file[file]
