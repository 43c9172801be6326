"""Time writing the weights file of an HTTP weight sync: the previous write against the current.

Why: writing the file the served engines load took 1.20 s of a 1.79 s sync on an H200
(Qwen2.5-0.5B in bf16, two engines). `previous` is that write: per parameter, cast where it
lives, `.contiguous().cpu()` (a blocking copy into new pageable memory), then
`safetensors.torch.save_file`. `current` is labkit.engines.weights_file: cast where it lives,
non-blocking copies into one kept (pinned, on a GPU) buffer, one synchronize, one sequential
write. Both rename a `.part` file into place, and the file is deleted after each write, as a
sync does (so every write allocates the file's pages again, as in a run).

The model is Qwen2.5-0.5B's architecture with random weights, built in --src-dtype on
--device (the trainer keeps float32 master weights on a GPU and syncs bfloat16). The two
writes take turns, --repeats each after one warm-up of each; the row gives each one's median
and all its times, and the folder's filesystem.

    python benchmarks/bench_weights_write.py --device cuda --src-dtype float32 --dtype bfloat16 \\
        --folder /dev/shm --out bench_write.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.engines.weight_sync import describe_folder  # noqa: E402
from labkit.engines.weights_file import WeightsWriter, plan_weights  # noqa: E402

# Qwen2.5-0.5B-Instruct's architecture (its config.json), as benchmarks/bench_update.py builds it.
QWEN25_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4_864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def random_model(device: str, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B)).to(dtype)


def previous_write(model, path: Path, dtype) -> None:
    """The write before labkit.engines.weights_file: a CPU tensor per parameter, save_file."""
    from safetensors.torch import save_file

    tensors = {}
    for name, p in model.named_parameters():
        t = p.detach()
        tensors[name] = (t.to(dtype) if dtype is not None else t).contiguous().cpu()
    tmp = path.with_name(path.name + ".part")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--src-dtype", default="bfloat16", help="the parameters' dtype")
    p.add_argument("--dtype", default="bfloat16", help="the file's dtype (the sync dtype)")
    p.add_argument("--folder", default="/dev/shm", help="where the file is written")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="append the row here (JSON lines)")
    a = p.parse_args(argv)
    src, dtype = getattr(torch, a.src_dtype), getattr(torch, a.dtype)
    model = random_model(a.device, src)
    path = Path(a.folder) / f"bench-weights-{os.getpid()}.safetensors"
    writer = WeightsWriter()
    times: dict[str, list[float]] = {"previous": [], "current": []}
    parts: list[dict] = []

    def once(which: str) -> tuple[float, int]:
        t = time.perf_counter()
        if which == "previous":
            previous_write(model, path, dtype)
        else:
            w = writer.write(plan_weights(model, dtype), path)
            parts.append({"gather_s": round(w.gather_s, 4), "file_s": round(w.file_s, 4)})
        seconds = time.perf_counter() - t
        size = path.stat().st_size
        path.unlink()
        return seconds, size

    sizes = {}
    try:
        for which in times:  # warm-up: the staging buffer, the allocator, the page cache
            _, sizes[which] = once(which)
        parts.clear()
        for _ in range(a.repeats):
            for which in times:
                times[which].append(round(once(which)[0], 4))
    finally:
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".part").unlink(missing_ok=True)
    gpu = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "no GPU"
    row = {"machine": f"{gpu}; {os.cpu_count()} CPU cores; {platform.machine()}",
           "versions": {"torch": torch.__version__, "python": platform.python_version()},
           "device": a.device, "src_dtype": a.src_dtype, "dtype": a.dtype,
           "folder": describe_folder(a.folder), "bytes": sizes,
           "tensors": plan_weights(model, dtype).tensors, "repeats": a.repeats,
           **{f"{k}_median_s": statistics.median(v) for k, v in times.items()},
           "times_s": times, "current_parts": parts}
    print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
