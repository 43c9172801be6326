"""The `labkit` command: launch a run, compare runs, replay an incident, serve engines.

    labkit launch --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rm-type math
    MILES_NUM_ROLLOUT=24 MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128" labkit launch
    labkit launch --preset cpu                      # the embedded offline default (SmolLM2, CPU)
    labkit launch --resume runs/<name>              # continue a stopped run
    labkit launch --backend miles --dry-run         # print the same recipe as a miles command
    labkit compare data/runs/*                      # the group-size table and plots
    labkit replay data/incidents/<log>.jsonl        # 503 bursts through the watchdog
    labkit serve --engines 2                        # engines behind a router, on loopback
    labkit students notebooks/                      # student notebooks, solutions stripped
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from labkit.config import ConfigError, build_parser, resolve_args

COMMANDS = ("launch", "compare", "replay", "serve", "students")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"labkit: unknown command {cmd!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return {"launch": launch_main, "compare": compare_main, "replay": replay_main,
                "serve": serve_main, "students": students_main}[cmd](rest)
    except ConfigError as e:
        print(f"labkit {cmd}: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # engines over HTTP that cannot be reached: a message, no traceback
        from labkit.client import RouterUnavailable
        from labkit.engines.http import WeightSyncFailed

        if not isinstance(e, (RouterUnavailable, WeightSyncFailed)):
            raise
        print(f"labkit {cmd}: {e}", file=sys.stderr)
        return 1


def launch_main(argv: list[str]) -> int:
    """`labkit launch`: the recipe's flags, plus --resume, --backend and --dry-run."""
    if "-h" in argv or "--help" in argv:
        build_parser().print_help()
        print("\nalso: --resume RUN_DIR, --backend {labkit,miles}, --dry-run")
        return 0
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--resume", default=None)
    pre.add_argument("--backend", default="labkit", choices=["labkit", "miles"])
    pre.add_argument("--dry-run", action="store_true")
    own, rest = pre.parse_known_args(argv)
    if own.resume:
        return _resume(own.resume, rest)
    if own.backend == "miles":
        from labkit import miles

        cfg, explicit = resolve_args(rest, check=False)
        try:
            miles.refuse_unsupported(cfg, explicit)
        except miles.MilesUnsupported as e:
            print(f"labkit launch --backend miles: {e}", file=sys.stderr)
            return 2
        return miles.main(cfg.check(), explicit=explicit, dry_run=own.dry_run, out_dir=None)
    cfg, explicit = resolve_args(rest)
    if own.dry_run:
        print(_describe(cfg))
        return 0
    _say_batch(cfg)
    from labkit.trainer import train

    run = train(cfg)
    print(f"run log: {run.dir / 'metrics.jsonl'}")
    return 0 if (run.status or {}).get("reason") != "error" else 1


def _resume(run_dir: str, rest: list[str]) -> int:
    """Continue a run folder with its own config (flags may only change bookkeeping)."""
    from labkit.run import saved_config
    from labkit.trainer import train

    cfg = saved_config(run_dir)
    if rest:
        _, explicit = resolve_args(rest, env={})
        given = build_parser().parse_args(rest)
        cfg = cfg.replace(**{k: getattr(given, k) for k in explicit})
    run = train(cfg.check(), resume=run_dir)
    print(f"run log: {run.dir / 'metrics.jsonl'}")
    return 0


def _say_batch(cfg) -> None:
    """Say once when a rollout gives more than one optimizer step (the recipe gives one)."""
    if cfg.steps_per_rollout > 1:
        print(f"labkit: {cfg.rollout_batch_size} prompts x {cfg.n_samples_per_prompt} answers = "
              f"{cfg.samples_per_rollout} samples / --global-batch-size {cfg.global_batch_size} "
              f"= {cfg.steps_per_rollout} optimizer steps per rollout")


def _describe(cfg) -> str:
    lines = [f"{k.replace('_', '-')}: {v}" for k, v in cfg.to_dict().items()]
    lines.append(f"steps per rollout: {cfg.steps_per_rollout}")
    return "\n".join(lines)


def compare_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="labkit compare", description="the group-size table and plots")
    p.add_argument("runs", nargs="+", help="run folders, or folders of run folders")
    p.add_argument("--out", default=None, help="folder for the plots")
    p.add_argument("--reference", type=int, default=8, help="reference group size (default 8)")
    p.add_argument("--mixed", action="store_true",
                   help="compare runs that differ in learning rate, model or prompts per rollout")
    a = p.parse_args(argv)
    from labkit.compare import compare_main as run_compare

    return run_compare(a.runs, a.out, reference=a.reference, mixed=a.mixed)


def replay_main(argv: list[str]) -> int:
    from labkit.watchdog import replay_main as run_replay

    return run_replay(argv)


def serve_main(argv: list[str]) -> int:
    from labkit.serve import serve_main as run_serve

    return run_serve(argv)


def students_main(argv: list[str]) -> int:
    from labkit.students import students_main as run_students

    return run_students(argv)


if __name__ == "__main__":
    raise SystemExit(main())
