"""Execute the lessons in a real Jupyter kernel, as JupyterLab would, and time them.

Each notebook runs cell by cell through nbclient in one kernel of its own (the kernel this
Python can start: ipykernel on its path). In lesson 1.3 the rerun cell (the one that calls
`launch_many`) is interrupted once, as a student's ■ would, `--stop-after` seconds into it,
and then run again, which must continue the stopped runs. What comes back, in --out:

  lessons.json       per lesson: seconds, cells run, cells that raised (their first line),
                     and for 1.3 what the interrupted cell and its rerun printed last
  <lesson>.ipynb     the executed copy (outputs included: keep it out of the repository)

    LABKIT_PROFILE=gpu LABKIT_MODEL=... LABKIT_DATA=... \
      python scripts/gpu/lessons.py --out OUT [--stop-after 120] [notebooks/03_group_size.ipynb ...]

On the lent GPU machine the kernel's packages travel as wheels (../shared/device/README.md:
prepare.sh --wheels), these as of 2026-12-02: nbclient==0.11.0 nbformat==5.11.1
jupyter_client==8.10.0 jupyter_core==5.9.1 ipykernel==7.4.0 ipython==9.18.1 traitlets==5.16.1
tornado==6.6.1 comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4
fastjsonschema==2.22.3 jedi==0.20.1 parso==0.8.7 prompt_toolkit==3.0.53 stack-data==0.6.3
executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 pexpect==4.9.0 ptyprocess==0.7.0
wcwidth==0.9.4 platformdirs==4.14.9 ipython_pygments_lexers==1.1.1 ipywidgets==8.1.9
widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17 Pygments==2.21.0 (pyzmq, jsonschema,
referencing and rpds-py come with vLLM's). The lessons read data/ (our runs, the incident)
and the runner copies notebooks/ beside it, so those travel with every call: with
benchmarks/results/ moved out of the working tree while the calls are made (the tracked
files are then about 20.5 MB), CHUNK=42M keeps each chunk's call within the 64 MiB one
call carries (19 chunks with --model qwen-coder --vllm and the wheels above; the small
last chunks of the model and of the packages can go with the work call). On 2026-12-03 the
three lessons ran this way in 18 minutes of an H200 (BENCHMARKS.md, "the three lessons in a
Jupyter kernel").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

LESSONS = ["notebooks/01_launcher.ipynb", "notebooks/02_watchdog_replay.ipynb",
           "notebooks/03_group_size.ipynb"]


def is_rerun_cell(cell) -> bool:
    return cell.cell_type == "code" and "launch_many(" in "".join(cell.source)


def last_text(cell, chars: int = 400) -> str:
    """The end of what a cell printed (streams and plain-text results)."""
    text = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text.append(out.get("text", ""))
        elif out.get("output_type") == "error":
            text.append(f"{out.get('ename')}: {out.get('evalue')}")
        elif "data" in out:
            text.append(out["data"].get("text/plain", ""))
    return "".join(text)[-chars:]


def errors_of(cell) -> list[str]:
    return [f"{o.get('ename')}: {str(o.get('evalue')).splitlines()[0] if o.get('evalue') else ''}"
            for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def interrupt(client: NotebookClient) -> None:
    """SIGINT to the kernel, as JupyterLab's ■ sends it (ipykernel's interrupt mode)."""
    os.kill(client.km.provisioner.pid, signal.SIGINT)


def run_lesson(path: Path, out: Path, stop_after: float, cell_timeout: int) -> dict:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    record = {"lesson": path.name, "cells": 0, "raised": [], "seconds": None}
    start = time.monotonic()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if is_rerun_cell(cell) and stop_after > 0 and "stop" not in record:
                timer = threading.Timer(stop_after, interrupt, (client,))
                timer.start()
                t0 = time.monotonic()
                client.execute_cell(cell, i)
                timer.cancel()
                record["stop"] = {"cell": i, "seconds": round(time.monotonic() - t0, 1),
                                  "printed": last_text(cell), "raised": errors_of(cell)}
                t0 = time.monotonic()
                client.execute_cell(cell, i)  # the cell again: the stopped runs continue
                record["rerun"] = {"cell": i, "seconds": round(time.monotonic() - t0, 1),
                                   "printed": last_text(cell), "raised": errors_of(cell)}
            else:
                client.execute_cell(cell, i)
            record["cells"] += 1
            record["raised"] += [f"cell {i}: {e}" for e in errors_of(cell)]
            print(f"[{time.monotonic() - start:7.1f} s] {path.name} cell {i} done", flush=True)
    record["seconds"] = round(time.monotonic() - start, 1)
    nbformat.write(nb, out / path.name)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lessons", nargs="*", default=LESSONS)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stop-after", type=float, default=120.0,
                    help="seconds into lesson 1.3's rerun cell to interrupt it (0: no stop)")
    ap.add_argument("--cell-timeout", type=int, default=1800)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for lesson in args.lessons:
        results.append(run_lesson(Path(lesson), args.out, args.stop_after, args.cell_timeout))
        (args.out / "lessons.json").write_text(json.dumps(results, indent=1))
    return 1 if any(r["raised"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
