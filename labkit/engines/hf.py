"""The transformers engine: batched `generate` on the policy module itself.

It is the fallback when vLLM is not there (a CPU laptop, a CI machine). It shares the
trainer's module, so "loading new weights" costs nothing: the next rollout samples from
the weights the optimizer just wrote. Temperature and top-p are applied by our own logits
processor, which also records the log-prob of each sampled token under the distribution it
was sampled from; the trainer compares those with its own log-probs
(`train/train_rollout_logprob_abs_diff`), as it does for vLLM. A second processor counts
the answers finished and the tokens written while `generate` runs, for the progress bar:
on a CPU one batch of answers can take minutes. For the same reason `cancel` is asked after
every token (a stopping criterion), so that a held-out evaluation stops within seconds, and
`interrupt` before every decoder layer (a forward pre-hook): the first token reads the
prompts, one forward pass that took 11 s for 16 prompts on one core, and a stop that came
during it waited for its end.

Reading the prompts is most of a short answer's time on a CPU: the cpu preset's prompts
are ~176 tokens, of which 145 (the instructions and two worked examples) are the same in
every prompt. A batch's shared prefix is read once and its keys and values repeated for
every row (`shared_prefix`, `_prefix_cache`); each row then reads only its own tokens, with
the positions they have in its prompt: the same answers and log-probs as reading each whole.
"""

from __future__ import annotations

import inspect
import time

import torch

from labkit.engines.base import BetweenBatches, Cancelled, Completion, Engine, Sampling


class _SamplingRecorder:
    """Logits processor: temperature and top-p, and the log-prob of each chosen token.

    generate() calls it once per new token with the ids so far; the token chosen at the
    previous call is the last of those ids, so its log-prob is read one call late (and the
    final one after generation ends).
    """

    def __init__(self, temperature: float, top_p: float):
        self.temperature, self.top_p = temperature, top_p
        self.last_logp: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.collect(input_ids[:, -1])
        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            sorted_scores, idx = scores.sort(dim=-1, descending=True)
            cum = sorted_scores.softmax(-1).cumsum(-1)
            drop = cum - sorted_scores.softmax(-1) > self.top_p  # keep the token that crosses p
            scores = scores.scatter(-1, idx, sorted_scores.masked_fill(drop, float("-inf")))
        self.last_logp = torch.log_softmax(scores, dim=-1)
        return scores

    def collect(self, chosen: torch.Tensor) -> None:
        if self.last_logp is not None:
            self.chosen.append(self.last_logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1))
            self.last_logp = None


class _ProgressCounter:
    """Logits processor that changes nothing: every `every_s` seconds it reports the answers
    finished (a stop token written) and the tokens written so far in this batch, on top of
    the batches before it."""

    def __init__(self, report, width: int, stop_ids, before: tuple[int, int], total: int,
                 every_s: float = 0.5, clock=time.monotonic):
        self.report, self.width, self.total = report, width, total
        self.stop = torch.tensor(sorted(stop_ids), dtype=torch.long)
        self.done_before, self.tokens_before = before
        self.every_s, self.clock, self.last = every_s, clock, clock()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            done, tokens = self.count(input_ids[:, self.width:])
            self.report(self.done_before + done, self.total, self.tokens_before + tokens)
        return scores

    def count(self, new: torch.Tensor) -> tuple[int, int]:
        """(rows with a stop token, tokens up to and including each row's first stop)."""
        if new.shape[1] == 0:
            return 0, 0
        stops = torch.isin(new, self.stop.to(new.device))
        finished = stops.any(dim=1)
        first = torch.where(finished, stops.int().argmax(dim=1) + 1,
                            torch.full_like(finished, new.shape[1], dtype=torch.long))
        return int(finished.sum()), int(first.sum())


class _CancelCheck:
    """Stopping criterion: every row ends at once when `cancel()` says so (asked once a token)."""

    def __init__(self, cancel):
        self.cancel, self.fired = cancel, False

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.fired = self.fired or bool(self.cancel())
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)


class _LayerCheck:
    """Forward pre-hooks on the model's decoder layers that raise Cancelled when `interrupt()`
    says so: a stop ends a long forward pass (the prompts' reading) within one layer."""

    def __init__(self, model, interrupt):
        self.interrupt = interrupt
        layers = _decoder_layers(model)
        self.handles = [layer.register_forward_pre_hook(self) for layer in layers]

    def __call__(self, module, args):
        if self.interrupt():
            raise Cancelled("cancelled inside a forward pass")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


SHARED_PREFIX_MIN = 32  # tokens every prompt of a batch must share before they are read once


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt of a batch shares and the engine reads once: the
    common prefix (the system prompt and worked examples of a chat template), short of each
    prompt's last token (every row must read at least one token of its own); 0 when that
    is under SHARED_PREFIX_MIN tokens, or for one prompt."""
    if len(prompts) < 2:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = next((k for k in range(n) if p[k] != first[k]), n)
    return n if n >= SHARED_PREFIX_MIN else 0


def _layout(prompts: list[list[int]], shared: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's input ids and attention mask: left padding, so that every answer starts at
    the same column; with a `shared` prefix, the padding goes after it, before each prompt's
    own tokens ([prefix, pad..., rest]), so the prefix's keys and values are the same in
    every row. The mask gives each token the position it has in its own prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) + shared :] = torch.tensor(p[shared:])
        attn[r, width - len(p) + shared :] = 1
        if shared:
            ids[r, :shared] = torch.tensor(p[:shared])
            attn[r, :shared] = 1
    return ids, attn


def _prefix_cache(model, prefix: torch.Tensor, rows: int) -> dict:
    """The keys and values of a prefix every row shares, read once and repeated for `rows`
    rows, as `generate` takes them (it then reads only the tokens after them). On two CPU
    cores the prompts' reading is most of a short answer's time, and the cpu preset's
    prompts share 145 of their ~176 tokens (the instructions and two worked examples)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # transformers before the config argument
        cache = DynamicCache()
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    model(input_ids=prefix, use_cache=True, **{name: cache})
    cache.batch_repeat_interleave(rows)
    return {name: cache}


def _decoder_layers(model) -> list:
    """The model's stack of decoder layers: its longest nn.ModuleList (none found: [])."""
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(stacks, key=len)) if stacks else []


class HFEngine(Engine):
    """Rollouts with `model.generate`, `max_batch` sequences per call (all when None)."""

    name = "hf"

    def __init__(self, model, tokenizer, *, max_batch: int | None = None):
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], sampling: Sampling, between_batches: BetweenBatches = None
    ) -> list[list[Completion]]:
        jobs = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(sampling.n)]
        size = self.max_batch or len(jobs)
        out: list[list[Completion]] = [[] for _ in prompt_ids]
        done = tokens = 0
        self.report_progress(0, len(jobs), 0)
        for b, start in enumerate(range(0, len(jobs), size)):
            if b and between_batches is not None:
                between_batches()
            if self.cancel is not None and self.cancel():
                raise Cancelled(f"cancelled after {done} of {len(jobs)} answers")
            chunk = jobs[start : start + size]
            seed = None if sampling.seed is None else sampling.seed + b
            counter = None
            if self.progress is not None:
                width = max(len(ids) for _, ids in chunk)
                counter = _ProgressCounter(self.report_progress, width, sampling.stop_token_ids,
                                           (done, tokens), len(jobs))
            for (i, _), c in zip(chunk, self._generate_chunk([ids for _, ids in chunk], sampling,
                                                             seed, counter)):
                c.prompt_index = i
                out[i].append(c)
                done, tokens = done + 1, tokens + len(c.token_ids)
            self.report_progress(done, len(jobs), tokens)
        return out

    def _generate_chunk(self, prompts: list[list[int]], s: Sampling, seed: int | None,
                        counter: _ProgressCounter | None = None) -> list[Completion]:
        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        shared = shared_prefix(prompts)
        ids, attn = _layout(prompts, shared, tok.pad_token_id)
        greedy = s.temperature == 0
        recorder = None if greedy else _SamplingRecorder(s.temperature, s.top_p)
        processors = [p for p in (recorder, counter) if p is not None]
        check = None if self.cancel is None else _CancelCheck(self.cancel)
        layers = None if self.interrupt is None else _LayerCheck(model, self.interrupt)
        if seed is not None:
            torch.manual_seed(seed)
        was_training = model.training
        model.eval()
        try:
            cache = _prefix_cache(model, ids[:1, :shared].to(device), len(prompts)) if shared else {}
            seqs = model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device),
                generation_config=self._generation_config(s, greedy),
                logits_processor=processors or None,
                stopping_criteria=[check] if check is not None else None, **cache,
            )
        finally:
            model.train(was_training)
            if layers is not None:
                layers.remove()
        if check is not None and check.fired:
            raise Cancelled("cancelled while writing a batch of answers")
        new = seqs[:, width:].cpu()
        logps = None
        if recorder is not None:
            recorder.collect(seqs[:, -1])
            logps = torch.stack(recorder.chosen, dim=1).cpu() if recorder.chosen else None
        return [self._completion(row, None if logps is None else logps[r], s) for r, row in enumerate(new)]

    def _generation_config(self, s: Sampling, greedy: bool):
        # A fresh config: the model's own (e.g. Qwen's repetition_penalty 1.05, top_k 20)
        # would change the distribution we sample from and record.
        from transformers import GenerationConfig

        # Greedy takes no sampling knobs (transformers warns about each one given).
        sampling = {} if greedy else dict(temperature=1.0, top_p=1.0, top_k=0)
        return GenerationConfig(
            do_sample=not greedy, repetition_penalty=1.0, max_new_tokens=s.max_tokens,
            eos_token_id=list(s.stop_token_ids) or None,
            pad_token_id=self.tokenizer.pad_token_id, use_cache=True, **sampling,
        )

    def _completion(self, row: torch.Tensor, logp: torch.Tensor | None, s: Sampling) -> Completion:
        tokens = row.tolist()
        end, reason = len(tokens), "length"
        for j, t in enumerate(tokens):
            if t in s.stop_token_ids:
                end, reason = j + 1, "stop"  # the stop token is part of the answer: it is learned
                break
        tokens = tokens[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Completion(
            prompt_index=-1, token_ids=tokens, text=text, finish_reason=reason,
            logprobs=None if logp is None else logp[:end].tolist(),
        )

    def update_weights(self, model) -> None:
        if model is not self.model:  # an engine built on another copy of the policy
            self.model.load_state_dict(model.state_dict())
