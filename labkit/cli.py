"""The `labkit` command: every sub-command's flags, and the one line a refusal prints.

    labkit launch --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rm-type math
    MILES_NUM_ROLLOUT=24 MILES_EXTRA_ARGS="--n-samples-per-prompt 4 --global-batch-size 128" labkit launch
    labkit launch --preset cpu                      # the embedded offline default (SmolLM2, CPU)
    labkit launch --resume runs/<name>              # continue a stopped run
    labkit launch --backend miles --dry-run         # print the same recipe as a miles command
    labkit sweep --n-samples-per-prompt 4,8,16 --seed 1,2   # six runs, side by side on the GPUs
    labkit compare data/runs/n*-lr1e-6-*            # the group-size table and plots
    labkit replay data/incidents/<log>.jsonl        # 503 bursts through the watchdog
    labkit serve --engines 2                        # engines behind a router, on loopback
    labkit students notebooks/                      # student notebooks, solutions stripped

This is the only module that reads a command line. `labkit launch`'s flags are generated
from RunConfig's fields and `labkit serve`'s from ServeConfig's (labkit.config), so each
flag's help is written once, beside its field; the library functions each command calls
take configs and paths, never argv.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from labkit.config import (
    ConfigError,
    RunConfig,
    add_config_flags,
    config_from_flags,
    resolve_args,
    values_may_start_with_a_dash,
)
from labkit.config import build_parser as build_run_parser
from labkit.errors import LabkitError, debug_enabled, one_line


# ----------------------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    """`labkit COMMAND ...`: one sub-parser per command."""
    p = argparse.ArgumentParser(prog="labkit", description=__doc__.split("\n")[0],
                                epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an error (also env LABKIT_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # launch: its flags are RunConfig's; it reads them itself (miles' env vars come in order)
    launch = sub.add_parser("launch", add_help=False,
                            help="train with GRPO: the recipe's flags (labkit launch --help)")
    launch.add_argument("argv", nargs=argparse.REMAINDER)
    sweep = sub.add_parser("sweep", add_help=False,
                           help="several runs from one command: launch's flags, a comma-separated "
                                "value runs each (side by side on the GPUs)")
    sweep.add_argument("argv", nargs=argparse.REMAINDER)
    one = sub.add_parser("launch-config")  # a sweep's run (labkit.sweep)
    one.add_argument("file")
    one.add_argument("--resume", default=None)
    _compare_flags(sub.add_parser("compare", help="the group-size table and plots of run folders"))
    _replay_flags(sub.add_parser("replay", help="a client log's 503 bursts through the watchdog"))
    _serve_flags(sub.add_parser("serve", help="vLLM engines behind a router, on loopback"))
    _students_flags(sub.add_parser("students", help="students' copies of the lessons"))
    _fake_engine_flags(sub.add_parser("fake-engine"))  # started by `labkit serve --backend fake`
    return p


def launch_parser() -> argparse.ArgumentParser:
    """`labkit launch`: RunConfig's flags, then --resume, --backend and --dry-run."""
    p = build_run_parser()
    own = p.add_argument_group("launch", "what the command does with the config")
    own.add_argument("--resume", default=None, metavar="RUN_DIR",
                     help="continue this run folder with its own config")
    own.add_argument("--backend", default="labkit", choices=["labkit", "miles"],
                     help="labkit: train here; miles: write the same recipe as a miles script")
    own.add_argument("--dry-run", action="store_true",
                     help="print the resolved config (or the miles script) and stop")
    own.add_argument("--debug", action="store_true",
                     help="show the traceback of an error (also env LABKIT_DEBUG=1)")
    from labkit.miles.command import MILES_FLAGS_HELP

    p.add_argument_group("--backend miles", MILES_FLAGS_HELP)  # text only: what each flag becomes
    return p


def _compare_flags(p: argparse.ArgumentParser) -> None:
    from labkit.analysis.gains import EARLY, LATE, REFERENCE

    p.add_argument("runs", nargs="+", help="run folders, or folders of run folders")
    p.add_argument("--out", default="compare", help="folder for the plots (default: compare)")
    p.add_argument("--by", choices=["group_size", "setting"], default="group_size",
                   help="rows: group_size (runs share prompts per rollout), or setting (prompts "
                        "x answers, e.g. one sample budget split three ways)")
    p.add_argument("--reference", default=None,
                   help=f"the row the others are read against: a group size (default {REFERENCE}) "
                        f"or, with --by setting, prompts x answers (default '32 x 8')")
    p.add_argument("--mixed", action="store_true",
                   help="compare runs that differ in learning rate, model or prompts per rollout")
    p.add_argument("--early", type=_window, default=EARLY, metavar="A-B",
                   help=f"steps of the early window (default {EARLY[0]}-{EARLY[1]})")
    p.add_argument("--late", type=_window, default=LATE, metavar="A-B",
                   help=f"steps of the late window (default {LATE[0]}-{LATE[1]}); "
                        f"the gain is the late mean minus the early mean")


def _reference(a: argparse.Namespace):
    """--reference as the table's key: a group size (a number) or a setting ("32 x 8")."""
    if a.reference is None:
        return None
    text = " x ".join(part.strip() for part in str(a.reference).lower().split("x"))
    if a.by == "group_size":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--reference {a.reference!r}: with --by group_size it is a number "
                              f"of answers, e.g. 8") from None
    return text


def _window(text: str) -> tuple[int, int]:
    """'16-23' (or '5', one step) as (first, last)."""
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a window is FIRST-LAST, e.g. 16-23") from None
    if not 0 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= first <= last")
    return a, b


def _replay_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", help="a client log (.jsonl) written by labkit.serving.client")
    p.add_argument("--burst-gap", type=float, default=5.0, help="a gap longer than this ends a burst (s)")
    p.add_argument("--stall-s", type=float, default=60.0,
                   help="flag a stall after this long without a completion (s)")
    p.add_argument("--on-burst", choices=["keep", "lower"], default="keep", help="policy during a burst")
    p.add_argument("--stop-burst-s", type=float, default=None, help="stop when a burst lasts longer (s)")
    p.add_argument("--stop-stall-s", type=float, default=None, help="stop when a stall lasts longer (s)")
    p.add_argument("--open-limit", type=int, default=512, help="open-request limit the policy lowers")
    p.add_argument("--out", default="out/replay", help="folder for the timeline PNG and SVG")


def _serve_flags(p: argparse.ArgumentParser) -> None:
    from labkit.serving.cluster import ServeConfig

    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds (default: Ctrl-C)")
    add_config_flags(p, ServeConfig)


def _students_flags(p: argparse.ArgumentParser) -> None:
    from labkit.course.students import STUDENTS

    p.add_argument("src", nargs="?", default="notebooks",
                   help="folder of the source notebooks, with solutions (default: notebooks)")
    p.add_argument("--out", default=None, help=f"folder for the copies (default: SRC/{STUDENTS})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when the copies differ from what SRC gives")
    p.add_argument("--force", action="store_true",
                   help="overwrite copies that were edited since labkit wrote them (a student's "
                        "answers are lost)")


def _fake_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay-s", type=float, default=0.05, help="seconds per request")
    p.add_argument("--slots", type=int, default=8, help="requests generated at once")
    p.add_argument("--vocab-size", type=int, default=1000, help="token ids are drawn below this")
    p.add_argument("--served-model-name", default="fake")


def serve_config(argv: Sequence[str]):
    """(ServeConfig, duration or None) from `labkit serve`'s flags."""
    from labkit.serving.cluster import ServeConfig

    p = argparse.ArgumentParser(prog="labkit serve")
    _serve_flags(p)
    values = vars(p.parse_args(list(argv)))
    duration = values.pop("duration")
    return config_from_flags(ServeConfig, values), duration


# ----------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    debug = debug_enabled()
    while argv and argv[0] == "--debug":  # labkit --debug COMMAND ...
        argv, debug = argv[1:], True
    if not argv:
        parser.print_help()
        return 2
    if argv[0] in ("launch", "sweep"):  # own parsers: miles' env vars apply around the flags
        rest = [a for a in argv[1:] if a != "--debug"]
        command = launch if argv[0] == "launch" else sweep
        return _guarded(argv[0], command, rest, debug or len(rest) < len(argv) - 1)
    args = parser.parse_args(argv)
    commands = {"compare": compare, "replay": replay, "serve": serve, "students": students,
                "fake-engine": fake_engine, "launch-config": launch_config}
    return _guarded(args.command, commands[args.command], args, debug)


def _guarded(name: str, command, args, debug: bool = False) -> int:
    """Run a command; a refusal or failure labkit knows (a LabkitError: bad config, data,
    model, run folder, engines) is one line on stderr and its exit code. `--debug` or
    LABKIT_DEBUG=1 lets the traceback through instead."""
    try:
        return command(args)
    except LabkitError as e:
        if debug:
            raise
        where = getattr(e, "labkit_run_dir", None)
        more = f" (status and traceback: {Path(where) / 'status.json'})" if where else ""
        print(f"labkit {name}: {one_line(e)}{more}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # a second signal: the status is written already
        if debug:
            raise
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"labkit {name}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + int(signum)
    except (OSError, OverflowError) as e:  # a path that cannot be written, a number too large
        if debug or getattr(e, "labkit_run_dir", None):
            raise
        what = (f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename
                else one_line(e))
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
        fix = ("the disk is full: free some space" if full  # no path or number of the user's is wrong
               else "check the paths and numbers given")
        print(f"labkit {name}: {what} ({fix}; --debug shows the traceback)", file=sys.stderr)
        return 2
    except Exception as e:
        if debug:
            raise
        where = getattr(e, "labkit_run_dir", None)
        trace = (f"the traceback is in {Path(where) / 'status.json'}" if where
                 else "rerun with --debug (or LABKIT_DEBUG=1) for the traceback")
        print(f"labkit {name}: {e.__class__.__name__}: {one_line(e)} (an error labkit did not "
              f"expect; {trace})", file=sys.stderr)
        return 1


# ----------------------------------------------------------------------------- commands
def launch(argv: list[str]) -> int:
    """`labkit launch`: the recipe's flags, plus --resume, --backend and --dry-run."""
    if "-h" in argv or "--help" in argv:
        launch_parser().print_help()
        return 0
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--resume", default=None)
    pre.add_argument("--backend", default="labkit", choices=["labkit", "miles"])
    pre.add_argument("--dry-run", action="store_true")
    own, rest = pre.parse_known_args(argv)
    if own.resume:
        return _resume(own.resume, rest, dry_run=own.dry_run)
    if own.backend == "miles":
        from labkit import miles

        cfg, explicit = resolve_args(rest, check=False)
        try:
            miles.refuse_unsupported(cfg, explicit)
        except miles.MilesUnsupported as e:
            print(f"labkit launch --backend miles: {e}", file=sys.stderr)
            return 2
        return miles.launch(cfg.check(), explicit=explicit, dry_run=own.dry_run, out_dir=None)
    cfg, explicit = resolve_args(rest)
    _say_ignored(cfg, explicit)
    if own.dry_run:  # what the run would refuse before its weights load, refused the same way
        from labkit.run.log import check_new_run_folder
        from labkit.session import load_inputs

        check_new_run_folder(cfg)
        load_inputs(cfg)
        print(_describe(cfg))
        return 0
    _say_batch(cfg)
    from labkit.trainer import train

    return _ended(train(cfg))


def sweep(argv: list[str]) -> int:
    """`labkit sweep`: launch's flags, where a comma-separated value (`--seed 1,2,3`) runs each
    value; several such flags run every combination.

    Only numbers and named choices are lists: a comma in a path or a name stays. Where
    --global-batch-size is not given, each run takes prompts x answers (one optimizer step
    per rollout). --time-limit is each run's own: a run that reaches it stops, and the sweep
    goes on. The runs go to every GPU this process sees (--gpus 0,1 or LABKIT_GPUS limits
    them), as many on each as its free memory holds; on several GPUs the rest wait for a
    place. The whole sweep is checked before any run starts. A stopped sweep continues with
    the same command and --resume (the summary prints it). Exit 0 when every run completed,
    else the exit code of the first that did not, from what this command did: 124 its time
    limit, 128 + the signal of a stop, 1 a failure."""
    import inspect
    import shlex

    from labkit import sweep as sweepmod
    from labkit.machine import placement

    if "-h" in argv or "--help" in argv:
        print(inspect.cleandoc(sweep.__doc__).replace("`labkit sweep`: ", "labkit sweep: ") + "\n")
        sweep_parser().print_help()
        return 0
    words, own, values = _sweep_words(argv)
    configs, axes, prefix = sweep_configs(words, values)
    again = [*argv] + ([] if prefix is None else ["--run-name", prefix])
    again += [] if own["resume"] else ["--resume"]
    hints = sweepmod.Hints(resume=f"`labkit sweep {shlex.join(again)}`", rename="another --run-name",
                           flags=True)
    gpus = placement.parse_gpus(own["gpus"], "--gpus")
    if own["dry_run"]:  # the sweep's own checks (prepare_sweep): it refuses what the sweep would
        sweepmod.prepare_sweep(configs, resume=own["resume"], hints=hints, gpus=gpus, mps=own["mps"],
                               stagger_starts=own["stagger_starts"])
        print(_describe_sweep(configs, axes))
        return 0
    slots = sweepmod.run_sweep(configs, resume=own["resume"], hints=hints, gpus=gpus, mps=own["mps"],
                               stagger_starts=own["stagger_starts"])
    return sweepmod.sweep_exit_code(slots)


def sweep_parser() -> argparse.ArgumentParser:
    """`labkit sweep`'s flags, for its --help: RunConfig's, then the sweep's own."""
    p = build_run_parser(prog="labkit sweep")
    own = p.add_argument_group("sweep", "what the command does with the runs")
    own.add_argument("--resume", action="store_true",
                     help="continue a stopped sweep: the same flags (and --run-name) again; "
                          "completed runs are kept, stopped ones go on from their checkpoint, "
                          "the others start")
    own.add_argument("--dry-run", action="store_true", help="print the runs and start none")
    own.add_argument("--mps", action="store_true",
                     help="the runs that share a GPU reach an NVIDIA MPS server of the sweep's "
                          "own, so their kernels run at once instead of in turns (three 32 x 8 "
                          "runs on an H100: 7.8 s a step against 10.0); quit when the runs end")
    own.add_argument("--stagger-starts", action="store_true",
                     help="start the longest run alone and the others once it is ready to step, "
                          "so that they take vLLM's compiled graphs from its cache instead of "
                          "compiling them at once beside it")
    own.add_argument("--gpus", metavar="0,1",
                     help="the GPUs the runs may use, as nvidia-smi numbers them (also env "
                          "LABKIT_GPUS); default: every GPU this process sees "
                          "(CUDA_VISIBLE_DEVICES). Each run's process sees one of them")
    own.add_argument("--debug", action="store_true",
                     help="show the traceback of an error (also env LABKIT_DEBUG=1)")
    return p


def _sweep_words(argv: list[str]) -> tuple[list[str], dict, list[tuple[int, str]]]:
    """(words for RunConfig's parser, the sweep's own flags, (index, field) of each flag's
    value among the words). `--flag=value` is taken as two words, and a flag's value is the
    next word even when it starts with a dash (`--save-interval -1,1`). Which flags take a
    value is the parser's own word (flags_taking_values), so a flag that takes none
    (`--use-liger-kernel`) leaves the next word to its own flag, in any order."""
    from labkit.config import flags_taking_values

    takes = flags_taking_values()
    words, own, values, i = [], {"resume": False, "dry_run": False, "gpus": None, "mps": False,
                                 "stagger_starts": False}, [], 0
    while i < len(argv):
        word = argv[i]
        flag, eq, value = word.partition("=")
        if flag == "--gpus":
            if not eq and i + 1 >= len(argv):
                raise ConfigError("--gpus takes the GPUs' numbers, e.g. --gpus 0,1")
            own["gpus"] = value if eq else argv[i + 1]
            i += 1 if eq else 2
            continue
        if flag == "--backend":
            raise ConfigError("--backend: the sweep trains with labkit itself; for miles, write "
                              "each run's script with labkit launch --backend miles")
        if word in ("--resume", "--dry-run", "--mps", "--stagger-starts"):
            if word == "--resume" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                raise ConfigError(f"--resume takes no folder here ({argv[i + 1]!r}): it continues "
                                  f"the sweep's own runs (the same flags and --run-name); for one "
                                  f"run folder use labkit launch --resume {argv[i + 1]}")
            own[word[2:].replace("-", "_")] = True
        elif eq and flag in takes:
            values.append((len(words) + 1, takes[flag]))
            words += [flag, value]
        elif word in takes and i + 1 < len(argv):
            values.append((len(words) + 1, takes[word]))
            words += [word, argv[i + 1]]
            i += 1
        else:
            words.append(word)
        i += 1
    return words, own, values


def sweep_configs(words: list[str], values: list[tuple[int, str]]):
    """The sweep's configs, every combination of the listed values, each checked (ConfigError,
    one line, at the first that cannot run); also the axes, [(field, [text, ...])], and the
    run names' prefix when the sweep made it (None when --run-name gave it)."""
    import itertools

    from labkit.config import check_run_name, sweepable

    axes = [(i, name, _listed(name, words[i])) for i, name in values
            if name and sweepable(name) and "," in words[i]]
    configs, prefix = [], f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    for combo in itertools.product(*[[(i, v) for v in items] for i, _, items in axes]):
        args = list(words)
        for i, v in combo:
            args[i] = v
        cfg, explicit = resolve_args(args, check=False)
        if "global_batch_size" not in explicit:
            cfg = _derived_global_batch(cfg, explicit)
        if "run_name" in explicit:
            check_run_name(cfg.run_name)  # the prefix as given, before the values are added
            prefix = None
        name = cfg.run_name if prefix is None else prefix
        name += f"-p{cfg.rollout_batch_size}-n{cfg.n_samples_per_prompt}-s{cfg.seed}"
        name += "".join(f"-{field.replace('_', '-')}{v}" for (i, v), (_, field, _) in zip(combo, axes)
                        if field not in ("rollout_batch_size", "n_samples_per_prompt", "seed"))
        configs.append(cfg.replace(run_name=name).check())
    _refuse_repeated_runs(configs, [field for _, field, _ in axes])
    return configs, [(field, items) for _, field, items in axes], prefix


def _derived_global_batch(cfg: RunConfig, explicit: set[str]) -> RunConfig:
    """The config with --global-batch-size at prompts x answers (one optimizer step per
    rollout), where the sweep's flags do not give it. A number that cannot be a batch (an
    answer count of 0) is left for cfg.check() to name, as launch names it; a --micro-batch-size
    larger than the derived batch is refused, saying where that batch came from."""
    from labkit.config import fit_micro_batch

    p, n = cfg.rollout_batch_size, cfg.n_samples_per_prompt
    try:
        return fit_micro_batch(cfg.replace(global_batch_size=cfg.samples_per_rollout), explicit)
    except ConfigError as e:
        raise ConfigError(f"{e} (the sweep's --global-batch-size, where it is not given, is "
                          f"--rollout-batch-size {p} x --n-samples-per-prompt {n})") from None


def _refuse_repeated_runs(configs: list[RunConfig], listed: list[str]) -> None:
    """ConfigError when two of the sweep's runs would be one config twice: a listed flag whose
    values something later replaced for every run (the flag given again, MILES_EXTRA_ARGS)."""
    seen = set()
    for c in configs:
        key = json.dumps({**c.to_dict(), "run_name": None}, sort_keys=True, default=str)
        if key in seen:
            lost = [f for f in listed if len({getattr(x, f) for x in configs}) == 1]
            flags = ", ".join("--" + f.replace("_", "-") for f in lost) or "a listed flag"
            raise ConfigError(f"{flags}: the listed values do not reach the runs (a later {flags} or "
                              f"MILES_EXTRA_ARGS sets one value for all), so runs would repeat; "
                              f"give it once")
        seen.add(key)


def _listed(name: str, text: str) -> list[str]:
    """The values of one comma list, each checked as the flag's own value; ConfigError for an
    empty or a repeated one (`--seed 1,1` would run one seed twice)."""
    flag = "--" + name.replace("_", "-")
    items = [v.strip() for v in text.split(",")]
    if "" in items:
        raise ConfigError(f"{flag} {text!r}: an empty value in the list; write the values "
                          f"between commas, e.g. {flag} {','.join(v for v in items if v) or '1,2'}")
    parsed = [getattr(build_run_parser().parse_args([f"{flag}={v}"]), name) for v in items]
    for k, value in enumerate(parsed):
        if value in parsed[:k]:
            first = items[parsed.index(value)]
            same = f" (the same value as {first})" if first != items[k] else ""
            raise ConfigError(f"{flag} {text}: {items[k]} is listed twice{same}; list each value "
                              f"once")
    return items


def _describe_sweep(configs: list[RunConfig], axes) -> str:
    """--dry-run: the runs, one line each, and the values each takes."""
    lists = " x ".join(f"--{field.replace('_', '-')} {','.join(items)}" for field, items in axes)
    lines = [f"labkit sweep: {len(configs)} run{'s' if len(configs) != 1 else ''}"
             + (f" ({lists})" if lists else "") + "; nothing started (--dry-run)"]
    width = max(len(c.run_name) for c in configs)
    for c in configs:
        shown = " ".join(f"--{field.replace('_', '-')} {getattr(c, field)}" for field, _ in axes)
        lines.append(f"  {c.run_name.ljust(width)}  {shown}".rstrip())
    return "\n".join(lines)


def launch_config(a: argparse.Namespace) -> int:
    """`labkit launch-config FILE [--resume DIR]`: one run of a sweep, its RunConfig saved as
    JSON (with --resume, the run folder it continues)."""
    from labkit.trainer import train

    cfg = RunConfig(**json.loads(Path(a.file).read_text()))
    Path(a.file).unlink(missing_ok=True)
    return _ended(train(cfg, resume=a.resume))


def _resume(run_dir: str, rest: list[str], dry_run: bool = False) -> int:
    """Continue a run folder with its own config (flags may only change bookkeeping). With
    `dry_run`, check what the resume would refuse, print the config and start nothing."""
    from labkit.run.files import file_there
    from labkit.run.log import RunLogError, saved_config
    from labkit.trainer import train

    if not file_there(Path(run_dir) / "config.json"):
        raise RunLogError(f"--resume {run_dir}: not a labkit run folder (no config.json); "
                          f"name a folder under runs/")
    cfg = saved_config(run_dir)
    if rest:
        _, explicit = resolve_args(rest, env={})
        given = build_run_parser().parse_args(values_may_start_with_a_dash(rest))
        cfg = cfg.replace(**{k: getattr(given, k) for k in explicit})
    if dry_run:
        print(_describe(cfg.check()))
        print(_resume_plan(Path(run_dir), cfg))
        return 0
    return _ended(train(cfg.check(), resume=run_dir))


def _resume_plan(run_dir: Path, cfg: RunConfig) -> str:
    """What `--resume run_dir` would do, checked as the resume checks it (RunLog.check,
    the folder's config, its checkpoint, the inputs); a refusal is the resume's own."""
    from labkit.lifecycle import check_resumable
    from labkit.run.log import RunLog, refuse_other_config
    from labkit.session import load_inputs

    log = RunLog.check(run_dir)
    refuse_other_config(run_dir, cfg)
    found = check_resumable(log, cfg, log.last_step() + 1)
    load_inputs(cfg)
    where = (f"after step {found[0]} (its checkpoint)" if found is not None else "from step 0")
    return f"resume: {run_dir} would go on {where} to step {cfg.num_rollout - 1}; nothing started (--dry-run)"


def _ended(run) -> int:
    """Where the log is, and the exit code a queue reads: 0 completed, 124 time limit,
    128 + signal, 1 error (labkit.run.stopping.exit_code)."""
    from labkit.run.stopping import exit_code

    log = run.dir / "metrics.jsonl"
    print(f"run log: {log}" if log.exists() else
          f"run folder: {run.dir} (no step finished, so no {log.name} yet)")
    _say_reward(run)
    return exit_code(run.status)


def _say_reward(run) -> None:
    """One line: held-out accuracy before -> after with its paired interval (when the run
    evaluated at both ends), then the training reward at the start -> at the end, and where
    its plot is."""
    from labkit import analysis

    try:
        start, end, k = analysis.reward_at_ends(run.metrics)
        early, late = analysis.end_windows(run.metrics)
        figure = analysis.reward_curve(run.dir, early=early, late=late)
    except (analysis.AnalysisError, KeyError, ValueError):  # no finished step to speak of
        return
    try:
        written = analysis.save_figure(figure, run.dir, "reward")
    except OSError as e:  # a disk that filled after the run's last write: the run stands
        _say_plot_not_written(run, e)
        return
    try:  # the share of answers right: math_format's reward also pays for the format
        right = analysis.reward_parts(run.metrics)["answers right"]
        right_text = f", answers right {right.iat[0]:.3f} -> {right.iat[1]:.3f}"
    except analysis.AnalysisError:
        right_text = ""
    n = len(run.metrics)
    ends = (f"the first and the last of {n} steps" if k == 1
            else f"mean of the first and of the last {k} of {n} steps")
    held = analysis.heldout_line(analysis.heldout_change(run.dir))
    if not held:
        print(f"reward {start:.3f} -> {end:.3f}{right_text} ({ends}); plot: {written[0]}")
        return
    # held-out first; the training figures second, with why they swing
    prompts = run.config.get("rollout_batch_size")
    each = f", {k * prompts} problems each" if isinstance(prompts, int) else ""
    firsts = f"first vs last step of {n}" if k == 1 else f"first vs last {k} of {n} steps"
    train = (f"answers right {right.iat[0]:.3f} -> {right.iat[1]:.3f}, " if right_text else "")
    print(f"{held}; training {train}reward {start:.3f} -> {end:.3f} ({firsts}{each}: noisy); "
          f"plot: {written[0]}")


def _say_plot_not_written(run, e: OSError) -> None:
    """One line for a reward plot the disk had no room for (or that cannot be written there),
    naming the files and the run's status, which the run wrote before; what was half written
    of the plot is removed."""
    from labkit.run.files import write_failed

    paths = [run.dir / "reward.png", run.dir / "reward.svg"]
    for path in paths:
        path.unlink(missing_ok=True)
    words = str(write_failed(paths[0], e)).replace(str(paths[0]), f"the reward plot {paths[0]} "
                                                                  f"(and .svg)", 1)
    print(f"labkit: {words}; the run itself is written whole (its status: "
          f"{run.dir / 'status.json'})", file=sys.stderr, flush=True)


def _say_ignored(cfg: RunConfig, explicit: set[str]) -> None:
    """One line on stderr for vLLM-only flags the run's engine will not read."""
    from labkit.engines import ignored_engine_flags

    flags = ignored_engine_flags(cfg, explicit)
    if flags:
        one = len(flags) == 1
        engine = ("the engines behind --router-url" if cfg.rollout_mode == "http"
                  else "the hf engine this run uses")
        print(f"labkit launch: warning: {', '.join(flags)} only change{'s' if one else ''} vLLM "
              f"in the trainer's process; {engine} ignore{'' if cfg.rollout_mode == 'http' else 's'} "
              f"{'it' if one else 'them'}", file=sys.stderr)


def _say_batch(cfg: RunConfig) -> None:
    """Say once when a rollout gives more than one optimizer step (the recipe gives one)."""
    if cfg.steps_per_rollout > 1:
        print(f"labkit: {cfg.rollout_batch_size} prompts x {cfg.n_samples_per_prompt} answers = "
              f"{cfg.samples_per_rollout} samples / --global-batch-size {cfg.global_batch_size} "
              f"= {cfg.steps_per_rollout} optimizer steps per rollout")


def _describe(cfg: RunConfig) -> str:
    lines = [f"{k.replace('_', '-')}: {'auto' if v is None and k == 'eval_split_size' else v}"
             for k, v in cfg.to_dict().items()]
    lines.append(f"steps per rollout: {cfg.steps_per_rollout}")
    return "\n".join(lines)


def compare(a: argparse.Namespace) -> int:
    """`labkit compare RUN...`: print the table, the verdict and the common clean steps, and
    write the plots (PNG and SVG). Runs that did not reach the late window are left out with a
    line saying so. Returns 0, or 2 when the runs cannot be compared."""
    from labkit import analysis

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            runs = analysis.drop_unfinished(analysis.load_runs(a.runs), late=a.late)
            if not a.mixed:
                analysis.refuse_mixed_settings(runs, by=a.by)
            table = analysis.compare(runs, reference=_reference(a), mixed=a.mixed, by=a.by,
                                     early=a.early, late=a.late)
        except analysis.AnalysisError as e:
            _say_warnings(caught)
            print(f"labkit compare: {e}", file=sys.stderr)
            return 2
    _say_warnings(caught)
    common = table.attrs["common_clean_steps"]
    print(analysis.render_table(table))
    print()
    print(table.attrs["verdict"])
    if table.attrs.get("heldout_verdict"):
        print(table.attrs["heldout_verdict"])
    print(f"\nCommon clean steps ({len(common)}): {analysis.steps_text(common) or 'none'}")
    for note in table.attrs["notes"]:
        print(f"- {note}")
    try:
        written = analysis.plot_all(runs, Path(a.out), early=a.early, late=a.late)
    except OSError as e:
        print(f"labkit compare: --out {a.out}: cannot write the plots there ({e.strerror or e}); "
              f"choose a folder you can write to", file=sys.stderr)
        return 2
    print(f"\nwrote {len(written)} files to {a.out}: {', '.join(p.name for p in written)}")
    return 0


def _say_warnings(caught) -> None:
    """Each warning once (the table reads a run's files for more than one column)."""
    for message in dict.fromkeys(str(w.message) for w in caught):
        print(f"warning: {message}", file=sys.stderr)


def replay(a: argparse.Namespace) -> int:
    """`labkit replay LOG`: print the burst table and save the timeline. 0, or 2 for a bad log."""
    from labkit.serving.replay import replay as replay_log
    from labkit.serving.replay import timeline
    from labkit.serving.watchdog import Policy

    try:
        policy = Policy(on_burst=a.on_burst, stop_burst_s=a.stop_burst_s, stop_stall_s=a.stop_stall_s)
        result = replay_log(Path(a.log), a.burst_gap, a.stall_s, policy, a.open_limit)
    except (FileNotFoundError, ValueError, IsADirectoryError) as e:
        print(f"labkit replay: {e}", file=sys.stderr)
        return 2
    print(result.report())
    try:
        timeline(result, Path(a.out))
    except OSError as e:
        print(f"labkit replay: --out {a.out}: cannot write the timeline there "
              f"({e.strerror or e}); choose a folder you can write to", file=sys.stderr)
        return 2
    print(f"\ntimeline: {Path(a.out) / (Path(a.log).stem + '-timeline')}.png and .svg")
    return 0


def serve(a: argparse.Namespace) -> int:
    """`labkit serve`: engines behind a router until Ctrl-C or --duration."""
    from labkit.serving.cluster import ServeConfig
    from labkit.serving.cluster import serve as run_cluster

    values = {k: v for k, v in vars(a).items() if k not in ("command", "duration", "debug")}
    if a.duration is not None and not a.duration > 0:
        raise ConfigError(f"--duration {a.duration:g}: seconds to serve must be > 0 "
                          f"(leave it out to serve until Ctrl-C)")
    return run_cluster(config_from_flags(ServeConfig, values), a.duration)


def students(a: argparse.Namespace) -> int:
    """`labkit students [SRC] [--out DIR] [--check] [--force]`: write (or check) the students'
    copies. Returns 0; 1 when --check finds stale copies, or when copies a student edited were
    kept (--force overwrites them); 2 for a bad SRC or notebook."""
    from labkit.course.students import check_advice, stale_students, student_texts, write_students

    src = Path(a.src)
    if not src.is_dir() or not any(src.glob("*.ipynb")):
        print(f"labkit students: {src} holds no .ipynb notebook; name the folder of the "
              f"lessons, e.g. notebooks/", file=sys.stderr)
        return 2
    try:
        if a.check:
            problems = stale_students(src, a.out)
            for line in problems:
                print(line)
            if problems:
                print(check_advice(src, a.out, problems), file=sys.stderr)
                return 1
            print(f"students' copies up to date ({len(student_texts(src))} notebooks)")
            return 0
        written, kept = write_students(src, a.out, force=a.force)
        for path in written:
            print(f"wrote {path}")
    except (ValueError, json.JSONDecodeError) as e:
        print(f"labkit students: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"labkit students: cannot write {e.filename or a.out} ({e.strerror or e}); pass "
              f"--out a folder you can write to", file=sys.stderr)
        return 2
    if kept:
        one = len(kept) == 1
        print(f"labkit students: kept {len(kept)} {'copy' if one else 'copies'} edited since "
              f"labkit wrote {'it' if one else 'them'}: {', '.join(str(p) for p in kept)}; "
              f"{'it' if one else 'they'} may hold a student's answers. Move "
              f"{'it' if one else 'them'} away, or pass --force to overwrite", file=sys.stderr)
        return 1
    return 0


def fake_engine(a: argparse.Namespace) -> int:
    """`labkit fake-engine --port P`: one made-up engine server (what `labkit serve --backend
    fake` starts)."""
    from labkit.engines.fake_server import run_fake_engine

    return run_fake_engine(a.port, host=a.host, delay_s=a.delay_s, slots=a.slots,
                           vocab_size=a.vocab_size, served_model_name=a.served_model_name)


if __name__ == "__main__":
    raise SystemExit(main())
