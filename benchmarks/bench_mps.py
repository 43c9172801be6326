"""Time N processes decoding side by side on one GPU, without and with NVIDIA MPS.

Why: the runs of a sweep are separate processes, each with its own vLLM engine. Without MPS
the GPU runs one process's kernels at a time; a rollout's decode step is many small products
that leave most of the GPU idle, so runs side by side gain less than the GPU could give.
With MPS (a user-space server, `nvidia-cuda-mps-control -d`) kernels of several processes
run at once. This measures what that is worth before any run depends on it.

Each worker is a decode loop on Qwen2.5-0.5B's shapes (24 layers: the attention's
projections and the MLP, then the vocabulary head) at --batch rows, one step captured in a
CUDA graph as vLLM captures its decode, random bfloat16 weights. Workers start together
(a file each says it is ready, one file says go); each reports its own time. The row gives
the wall time of the group and each worker's steps a second, for 1 worker alone, N without
MPS, and N with MPS (labkit.machine.mps.server: the server `labkit sweep --mps` starts, with a
private pipe folder, quit at the end; a process without that folder's variable never reaches
it).

    python benchmarks/bench_mps.py --workers 4 --batch 256 --steps 3000 --out bench_mps.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, QKV = 896, 4864, 24, 151936, 1152


def worker(batch: int, steps: int, folder: Path, name: str, deadline_s: float) -> None:
    import torch

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g) * 0.02

    layers = [(w(HIDDEN, QKV), w(HIDDEN, HIDDEN), w(HIDDEN, 2 * INTERMEDIATE), w(INTERMEDIATE, HIDDEN))
              for _ in range(LAYERS)]
    head = w(HIDDEN, VOCAB)
    x = w(batch, HIDDEN)

    def step():
        h = x
        for qkv, o, up, down in layers:
            a = (h @ qkv)[:, :HIDDEN]
            h = h + a @ o
            gate, u = (h @ up).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * u) @ down
        return (h @ head).argmax(-1)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    (folder / f"{name}.ready").touch()
    end = time.monotonic() + deadline_s
    while not (folder / "go").exists():
        if time.monotonic() > end:
            raise SystemExit(f"{name}: no go within {deadline_s} s")
        time.sleep(0.005)
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    (folder / f"{name}.json").write_text(json.dumps({"s": took, "steps_per_s": steps / took}))


def group(n: int, args, env: dict, deadline_s: float) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-mps-"))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", f"w{i}", "--folder", str(folder),
                               "--batch", str(args.batch), "--steps", str(args.steps)], env=env)
             for i in range(n)]
    end = time.monotonic() + deadline_s
    try:
        while sum((folder / f"w{i}.ready").exists() for i in range(n)) < n:
            if time.monotonic() > end or any(p.poll() not in (None, 0) for p in procs):
                return {"workers": n, "error": "a worker did not get ready"}
            time.sleep(0.01)
        t0 = time.perf_counter()
        (folder / "go").touch()
        for p in procs:
            p.wait(timeout=max(1.0, end - time.monotonic()))
        wall = time.perf_counter() - t0
        each = [json.loads((folder / f"w{i}.json").read_text()) for i in range(n)]
        return {"workers": n, "wall_s": round(wall, 3),
                "steps_per_s_each": [round(e["steps_per_s"], 1) for e in each],
                "steps_per_s_total": round(n * args.steps / wall, 1)}
    except (subprocess.TimeoutExpired, FileNotFoundError) as e:
        return {"workers": n, "error": f"{type(e).__name__}: {e}"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256, help="decode rows a step (answers in flight)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds a group may take")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.batch, args.steps, Path(args.folder), args.worker, args.deadline)
        return

    from labkit.machine import mps

    rows = []
    base = {k: v for k, v in os.environ.items() if k not in (mps.PIPE_ENV, mps.LOG_ENV)}
    rows.append({"mps": False, **group(1, args, base, args.deadline)})
    rows.append({"mps": False, **group(args.workers, args, base, args.deadline)})
    why = mps.missing()
    if why:
        rows.append({"mps": True, "error": why})
    else:
        try:
            with mps.server() as env:  # the server `labkit sweep --mps` starts
                env = {**base, **env}
                rows.append({"mps": True, **group(1, args, env, args.deadline)})
                rows.append({"mps": True, **group(args.workers, args, env, args.deadline)})
        except mps.MPSError as e:
            rows.append({"mps": True, "error": str(e)})
    for row in rows:
        row.update(batch=args.batch, steps=args.steps)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
