"""The weights file of an HTTP weight sync (labkit.engines.weights_file) and where it goes.

The file is written by hand, not by safetensors, so these tests read it back with
safetensors itself (safe_open, as the engines do, and load_file): the same names, dtypes,
shapes and values as the model's parameters, in the asked dtype; a reader never sees half
a file; the staging buffer is kept between writes. Then the folder's description
(memory or disk, from the mounts) and the line a run prints about it at its first sync.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from labkit.engines import weight_sync, weights_file
from labkit.engines.weight_sync import SHM_SPARE_BYTES, describe_folder, fast_tmp, sync_folder_line
from labkit.engines.weights_file import WeightsWriter, plan_weights, write_weights


class Mixed(torch.nn.Module):
    """Parameters of several dtypes and shapes: a tied head, a scalar, an empty one, a
    transposed (not contiguous) one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(7, 3)
        self.head = torch.nn.Linear(3, 7, bias=False)
        self.head.weight = self.embed.weight  # tied: in the file once, as the embedding
        self.scale = torch.nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
        self.low = torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))
        self.empty = torch.nn.Parameter(torch.zeros(0, 4))
        self.turned = torch.nn.Parameter(torch.randn(4, 6).t())
        assert not self.turned.is_contiguous()


def expected(model, dtype=None) -> dict[str, torch.Tensor]:
    return {n: p.detach().to(p.dtype if dtype is None else dtype) for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float32])
def test_the_file_reads_back_with_safetensors_as_the_models_parameters(tmp_path, dtype):
    model = Mixed()
    path = tmp_path / "w.safetensors"
    assert write_weights(model, path, dtype) == 5
    want = expected(model, dtype)
    got = load_file(path)
    assert set(got) == set(want) == {"embed.weight", "scale", "low", "empty", "turned"}
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    with safe_open(str(path), framework="pt", device="cpu") as f:  # how an engine reads it
        assert sorted(f.keys()) == sorted(want) and f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_tensor("turned"), want["turned"])
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert (8 + n) % 8 == 0  # the data starts aligned
    assert path.stat().st_size == plan_weights(model, dtype).bytes


def test_tensors_start_aligned_to_their_element_size(tmp_path):
    plan = plan_weights(Mixed())  # float64, float32 and bfloat16 side by side
    for e in plan.entries:
        assert (len(plan.header) + e.begin) % e.dtype.itemsize == 0, e.name
    sizes = [e.dtype.itemsize for e in plan.entries]
    assert sizes == sorted(sizes, reverse=True)
    header = json.loads(plan.header[8:].decode())
    assert header["scale"] == {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}


def test_a_reader_never_sees_half_a_file(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    seen = []
    real = weights_file.write_chunks

    def watched(part: Path, chunks):
        seen.append((part.name, path.exists()))
        real(part, chunks)
        seen.append((part.name, path.exists()))

    monkeypatch.setattr(weights_file, "write_chunks", watched)
    write_weights(Mixed(), path, torch.bfloat16)
    assert seen == [("w.safetensors.part", False)] * 2  # not there until renamed whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_a_write_cut_short_leaves_neither_the_file_nor_the_part(tmp_path, monkeypatch):
    def cut_short(part: Path, chunks):
        part.write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(weights_file, "write_chunks", cut_short)
    with pytest.raises(OSError, match="No space left"):
        write_weights(Mixed(), tmp_path / "w.safetensors", torch.bfloat16)
    assert list(tmp_path.iterdir()) == []


def test_the_staging_buffer_is_kept_between_writes_and_not_made_when_not_needed(tmp_path):
    path = tmp_path / "w.safetensors"
    plain = torch.nn.Linear(4, 3)  # float32 on the CPU, written as float32: straight from memory
    writer = WeightsWriter()
    w = writer.write(plan_weights(plain), path)
    assert writer._staging is None and w.tensors == 2 and w.bytes == path.stat().st_size
    writer.write(plan_weights(plain, torch.bfloat16), path)  # a cast: staged
    first = writer._staging
    assert first is not None and first.numel() == plan_weights(plain, torch.bfloat16).data_bytes
    with torch.no_grad():
        plain.weight.add_(1.0)  # the next step's weights, through the same buffer
    w = writer.write(plan_weights(plain, torch.bfloat16), path)
    assert writer._staging is first and w.gather_s >= 0 and w.file_s >= 0
    assert torch.equal(load_file(path)["weight"], plain.weight.detach().bfloat16())
    writer.write(plan_weights(torch.nn.Linear(8, 8), torch.bfloat16), path)  # larger: a new one
    assert writer._staging is not first and writer._staging.numel() >= 8 * 8 * 2


def test_a_model_without_parameters_is_refused():
    with pytest.raises(ValueError, match="no parameters to send"):
        plan_weights(torch.nn.ReLU())


def test_a_refused_page_lock_falls_back_to_pageable_memory_once():
    writer = WeightsWriter()
    first = writer._buffer(64, pinned=True)  # a GPU's parameters ask for pinned memory
    if torch.cuda.is_available():
        assert first.is_pinned()
    else:  # a CPU build cannot pin: pageable, and it does not ask again
        assert writer._pin_refused and not writer._pinned
    assert writer._buffer(32, pinned=True) is first


# ---------------------------------------------------------------------- where the file goes
def mounts(tmp_path, *rows: str) -> str:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{r} 0 0\n" for r in rows))
    return str(path)


def test_a_folder_is_memory_on_tmpfs_and_disk_elsewhere(tmp_path, monkeypatch):
    table = mounts(tmp_path, "/dev/vda / ext4 rw", "tmpfs /dev/shm tmpfs rw", "tmpfs /dev/shm2 ext4 rw",
                   r"none /mnt/my\040disk xfs rw")
    monkeypatch.setattr(weight_sync, "MOUNTS", table)
    assert describe_folder("/dev/shm/labkit-weights-1-x") == {
        "root": "/dev/shm/labkit-weights-1-x", "kind": "memory", "fstype": "tmpfs"}
    assert describe_folder("/dev/shm2")["kind"] == "disk"  # a prefix of the name is not the mount
    assert describe_folder("/tmp")["fstype"] == "ext4"
    assert describe_folder("/mnt/my disk/w")["fstype"] == "xfs"
    monkeypatch.setattr(weight_sync, "MOUNTS", str(tmp_path / "none"))
    assert describe_folder("/tmp")["kind"] == "unknown"


def test_the_first_sync_line_names_the_folder_and_what_dev_shm_lacked(tmp_path, monkeypatch):
    table = mounts(tmp_path, "/dev/vda / ext4 rw", "tmpfs /dev/shm tmpfs rw")
    monkeypatch.setattr(weight_sync, "MOUNTS", table)
    gib = 2**30
    assert sync_folder_line("/dev/shm", gib, chosen=True) == (
        "weight sync through /dev/shm (memory, tmpfs), 1.00 GiB a sync")
    monkeypatch.setattr(weight_sync, "shm_free_bytes", lambda: 64 * 2**20)  # a container's 64 MB
    line = sync_folder_line("/tmp", gib, chosen=True)
    assert line.startswith("weight sync through /tmp (disk, ext4), 1.00 GiB a sync; /dev/shm has "
                           "0.06 GiB free, needs 2.00")
    assert "--shm-size" in line
    assert sync_folder_line("/tmp", gib, chosen=False) == (  # the caller's weights_dir: no advice
        "weight sync through /tmp (disk, ext4), 1.00 GiB a sync")


def test_dev_shm_is_taken_only_with_room_for_the_file_and_a_spare_gib(monkeypatch):
    monkeypatch.setattr(weight_sync, "shm_free_bytes", lambda: 3 * 2**30)
    assert fast_tmp(2 * 2**30 - 1) == "/dev/shm"
    assert fast_tmp(3 * 2**30 - SHM_SPARE_BYTES) is None
    monkeypatch.setattr(weight_sync, "shm_free_bytes", lambda: None)
    assert fast_tmp(1) is None


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_this_machines_dev_shm_is_described_from_its_mounts():
    assert describe_folder("/dev/shm")["kind"] in ("memory", "unknown")

