"""Copy run folders brought back from the GPU machine into data/runs, fit to commit.

What changes on the way: config.json's machine paths (model, data, output dir) become the
names of the model and data set; samples.jsonl loses each row's label (the GSM8K answer):
committed logs keep the row's split and index (`prompt_id`) and the model's completion,
whose restatements of the problem labkit already cut when it wrote them. Checkpoints and
stdout are left behind. eval_outcomes.jsonl (each held-out problem's outcome, named by its
split and index) comes as it is.

    python scripts/gpu/import_runs.py RUN_FOLDER... --dest data/runs \
        --model "Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, dequantized (see README)"
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

FILES = ["config.json", "metrics.jsonl", "samples.jsonl", "heat.jsonl", "eval.jsonl",
         "eval_outcomes.jsonl", "status.json"]
DATA_NAME = "gsm8k (local copy of openai/gsm8k main)"


def import_run(src: Path, dest_root: Path, model_name: str) -> Path:
    """Copy one run folder; return where it went. Refuses to overwrite an existing run."""
    if not (src / "metrics.jsonl").exists():
        raise SystemExit(f"{src}: not a labkit run folder (no metrics.jsonl)")
    dest = dest_root / src.name
    if dest.exists():
        raise SystemExit(f"{dest} exists; remove it first if it should be replaced")
    dest.mkdir(parents=True)
    for name in FILES:
        if not (src / name).exists():
            continue
        if name == "config.json":
            cfg = json.loads((src / name).read_text())
            cfg.update(model=model_name, data=DATA_NAME, output_dir="runs", run_name=dest.name)
            (dest / name).write_text(json.dumps(cfg, indent=2) + "\n")
        elif name == "samples.jsonl":
            rows = [json.loads(line) for line in (src / name).read_text().splitlines() if line.strip()]
            for row in rows:
                row.pop("label", None)
            (dest / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            shutil.copy(src / name, dest / name)
    return dest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders; each keeps its folder name")
    p.add_argument("--dest", type=Path, default=Path("data/runs"))
    p.add_argument("--model", required=True, help="the model's name to write in config.json")
    a = p.parse_args()
    for run in a.runs:
        print(import_run(run, a.dest, a.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
