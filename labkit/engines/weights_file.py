"""The trainer's weights as one safetensors file, staged in one buffer and written in one pass.

The served engines load the trainer's weights from a file (labkit.engines.weight_sync). How
fast that file is written is most of a sync's time, so it is written by hand rather than with
`safetensors.torch.save_file`, which needs a CPU tensor per parameter: on a GPU that means one
blocking copy into freshly allocated pageable memory per tensor, every sync. Here each
parameter is cast to the sync dtype where it lives (on the GPU: half the bytes to move, and
the GPU does the cast), copied without blocking into one CPU buffer that is kept between
syncs (pinned, so the copies are DMA transfers), and the stream is synchronized once. The
buffer is laid out as the file's data, so the file is the header and then one write of the
buffer. Parameters already on the CPU in the sync dtype are written straight from their own
memory, with no copy at all.

The format (safetensors' own, which every reader checks): 8 bytes little-endian, the length N
of a JSON header; N bytes of header, one entry per tensor (`dtype`, `shape`, `data_offsets`
into the data), padded with spaces to a multiple of 8; then the data, each tensor's bytes
back to back in C order. Tensors are ordered by element size, largest first, so every tensor
starts aligned to its element size. The file is written as `<name>.part` and renamed into
place, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

# torch dtype name -> safetensors dtype string
SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                      "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
                      "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


@dataclass(frozen=True)
class Entry:
    """One tensor of the file: its source (a parameter), its dtype in the file, its bytes."""

    name: str
    tensor: object  # torch.Tensor, detached
    dtype: object  # torch.dtype in the file
    begin: int
    end: int


@dataclass(frozen=True)
class WeightsPlan:
    """What a model's weights file will hold: its entries, header, and size in bytes."""

    entries: tuple[Entry, ...]
    header: bytes  # the 8-byte length and the padded JSON header
    data_bytes: int

    @property
    def tensors(self) -> int:
        return len(self.entries)

    @property
    def bytes(self) -> int:
        """The file's size."""
        return len(self.header) + self.data_bytes


@dataclass(frozen=True)
class WeightsWritten:
    """One file written: tensors, bytes, and where the time went (seconds)."""

    tensors: int
    bytes: int
    gather_s: float  # the parameters to CPU memory in the file's dtype (device copies, one sync)
    file_s: float  # the file itself: header, data, rename


def plan_weights(model, dtype=None) -> WeightsPlan:
    """The weights file of `model`'s parameters (Hugging Face names; a tied LM head appears
    once, as the embedding), each cast to `dtype` if given."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    params = [(name, p.detach()) for name, p in model.named_parameters()]
    if not params:
        raise ValueError("update_weights: the model has no parameters to send")
    params.sort(key=lambda named: -(named[1].dtype if dtype is None else dtype).itemsize)  # stable
    entries, header, offset = [], {"__metadata__": {"format": "pt"}}, 0
    for name, t in params:
        out = t.dtype if dtype is None else dtype
        size = t.numel() * out.itemsize
        entries.append(Entry(name, t, out, offset, offset + size))
        header[name] = {"dtype": _dtype_name(out), "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return WeightsPlan(tuple(entries), struct.pack("<Q", len(raw)) + raw, offset)


class WeightsWriter:
    """Writes weights files, keeping one staging buffer between writes.

    The buffer (pinned when the parameters are on a GPU) is the size of the file's data, and
    is kept: allocating and page-locking a gigabyte costs more than copying into it. It is
    replaced only when a larger file comes.
    """

    def __init__(self):
        self._staging, self._pinned = None, False
        self._pin_refused = False  # page-locked memory was refused once: pageable from then on

    def write(self, plan: WeightsPlan, path: Path) -> WeightsWritten:
        """Write `plan`'s file to `path` atomically (as path.part, then renamed)."""
        start = time.perf_counter()
        chunks = self._gather(plan)
        gathered = time.perf_counter()
        tmp = path.with_name(path.name + ".part")
        try:
            write_chunks(tmp, [plan.header, *chunks])
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return WeightsWritten(plan.tensors, plan.bytes, gathered - start,
                              time.perf_counter() - gathered)

    def _gather(self, plan: WeightsPlan) -> list[memoryview]:
        """The file's data as CPU memory: the parameters themselves when all are CPU tensors
        in the file's dtype, else the staging buffer with every tensor copied in."""
        import torch

        if all(e.tensor.device.type == "cpu" and e.tensor.dtype == e.dtype and e.tensor.is_contiguous()
               for e in plan.entries):
            return [_cpu_bytes(e.tensor) for e in plan.entries]
        devices = {e.tensor.device for e in plan.entries if e.tensor.device.type == "cuda"}
        buffer = self._buffer(plan.data_bytes, pinned=bool(devices))
        for e in plan.entries:
            src = e.tensor
            if src.device.type != "cpu" and src.dtype != e.dtype:
                src = src.to(e.dtype)  # on the GPU: it casts, and half the bytes cross to the CPU
            dst = buffer[e.begin:e.end].view(e.dtype).view(e.tensor.shape)
            dst.copy_(src, non_blocking=bool(devices))  # a CPU tensor is cast as it is copied
        for d in devices:  # the non-blocking copies have landed
            torch.cuda.synchronize(d)
        return [memoryview(buffer[:plan.data_bytes].numpy())]

    def _buffer(self, size: int, pinned: bool):
        import torch

        pinned = pinned and not self._pin_refused
        b = self._staging
        if b is None or b.numel() < size or self._pinned != pinned:
            self._staging = b = None  # the old one goes before the new one is made
            if pinned:
                try:
                    b = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                except RuntimeError:  # refused (a container's limit on locked memory)
                    self._pin_refused, pinned = True, False
            if b is None:
                b = torch.empty(size, dtype=torch.uint8)
            self._staging, self._pinned = b, pinned
        return b


def write_chunks(path: Path, chunks) -> None:
    """Write `chunks` (bytes-like) one after another into a new file at `path`."""
    with open(path, "wb") as f:  # a buffered file writes a large chunk whole, in a loop
        for c in chunks:
            f.write(c)


def write_weights(model, path: Path, dtype=None) -> int:
    """Save `model`'s parameters (cast to `dtype` if given) to a safetensors file at `path`,
    atomically (a reader never sees half a file); return the count of tensors."""
    return WeightsWriter().write(plan_weights(model, dtype), Path(path)).tensors


def _cpu_bytes(t) -> memoryview:
    """A contiguous CPU tensor's own memory as bytes (no copy)."""
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in SAFETENSORS_DTYPES:
        raise ValueError(f"update_weights: safetensors has no dtype for {dtype}")
    return SAFETENSORS_DTYPES[name]
