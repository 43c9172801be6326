"""The weight sync checked on each served engine: its log-probs of a fixed answer against the trainer's.

`train/train_rollout_logprob_abs_diff` compares the trainer with the engines on the
rollout's own answers, but the router decides which engine wrote which answer, so one
engine that missed a sync shows only as part of a mean, beside bf16 noise of the same size.
This check asks every engine by its own URL (not through the router), after every sync, for
the log-probs of one fixed text (vLLM's `prompt_logprobs`), and compares them with the
trainer's log-probs of the same tokens under the weights it just sent, and with what the
same engine answered at the previous sync. An engine that took the new weights answers
what the trainer computes (to the colocated engine's tolerance) and, when the trainer's
own numbers moved, something other than last time; a stale engine repeats itself.
`labkit launch --rollout-mode http --http-sync-check` turns it on (labkit.engines.http).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence

import aiohttp
import torch

from labkit.errors import LabkitError

# A made-up problem and its answer (no dataset text): the fixed tokens every check scores.
FIXED_TEXT = ("Question: Mia has 3 boxes with 4 pencils in each box. She gives away 5 pencils. "
              "How many pencils does she have left?\nAnswer: 3 x 4 = 12 pencils, and "
              "12 - 5 = 7. The answer is 7.")


class SyncCheckFailed(LabkitError, RuntimeError):
    """An engine did not answer the check's request with the log-probs it asked for."""


def fixed_token_ids(tokenizer=None, vocab_size: int | None = None, length: int = 32) -> list[int]:
    """FIXED_TEXT's token ids; without a tokenizer, `length` ids spread over the vocabulary."""
    if tokenizer is not None:
        return list(tokenizer.encode(FIXED_TEXT, add_special_tokens=False))
    if not vocab_size or vocab_size < 2:
        raise ValueError("fixed_token_ids: pass a tokenizer or a vocab_size of at least 2")
    return [(7919 * i + 17) % vocab_size for i in range(length)]


@torch.no_grad()
def trainer_logprobs(model, ids: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1 under `model` at temperature 1, float32 on the CPU.

    `dtype` is the precision the engines got (the sync's); below float32 the forward runs
    under autocast in it, as the trainer's own passes do, so the comparison is the
    colocated engine's."""
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=device)
    low = dtype is not None and dtype != torch.float32
    cast = torch.autocast(device.type, dtype=dtype) if low else contextlib.nullcontext()
    was = model.training
    model.eval()
    try:
        with cast:
            logits = model(input_ids=x).logits[0, :-1].float()
    finally:
        model.train(was)
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].cpu()


async def engine_logprobs(session: aiohttp.ClientSession, url: str, ids: Sequence[int],
                          model: str | None = None) -> torch.Tensor:
    """One engine's log-prob of each token of `ids` after the first (`prompt_logprobs`)."""
    body = {"prompt": list(map(int, ids)), "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0}
    if model:
        body["model"] = model
    try:
        async with session.post(url + "/v1/completions", json=body) as r:
            status, text = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise SyncCheckFailed(f"engine {url} did not answer the sync check's request "
                              f"({type(e).__name__}: {e})") from e
    if status != 200:
        raise SyncCheckFailed(f"engine {url} answered the sync check's request with HTTP "
                              f"{status}: {text[:300]}")
    try:
        steps = json.loads(text)["choices"][0]["prompt_logprobs"][1:]
        values = [float(step[str(t)]["logprob"]) for step, t in zip(steps, ids[1:])]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise SyncCheckFailed(
            f"engine {url} gave no prompt log-probs for the sync check ({type(e).__name__}: "
            f"{e}; answer {text[:200]!r}); a vLLM OpenAI server returns them "
            f"(`prompt_logprobs`); drop --http-sync-check for other engines") from None
    if len(values) != len(ids) - 1:
        raise SyncCheckFailed(f"engine {url} gave {len(values)} prompt log-probs for the sync "
                              f"check's {len(ids) - 1} tokens")
    return torch.tensor(values)


class SyncCheck:
    """The check across syncs: remembers what each engine and the trainer said last time."""

    def __init__(self, ids: Sequence[int], model_name: str | None = None,
                 timeout_s: float = 120.0):
        if len(ids) < 2:
            raise ValueError("SyncCheck: the fixed answer needs at least 2 tokens")
        self.ids, self.model_name, self.timeout_s = list(ids), model_name, timeout_s
        self.engines: dict[str, torch.Tensor] = {}
        self.trainer: torch.Tensor | None = None

    def run(self, model, urls: Sequence[str], dtype: torch.dtype | None = None) -> dict:
        """Score the fixed answer on the trainer and on every engine in `urls` (at least one);
        return the `client/sync_check_*` metrics (labkit.run.metrics) and remember the values.
        The change metrics need a last time: the first check returns the difference alone."""
        from labkit.serving.client import run_sync

        if not urls:
            raise ValueError("SyncCheck.run: no engine URLs to check")
        start = time.perf_counter()
        want = trainer_logprobs(model, self.ids, dtype)

        async def ask_all():
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                return await asyncio.gather(*(engine_logprobs(session, u, self.ids,
                                                              self.model_name) for u in urls))

        got = dict(zip(urls, run_sync(ask_all())))
        m = {"client/sync_check_abs_diff": max(float((lp - want).abs().mean())
                                               for lp in got.values())}
        moved = [float((lp - self.engines[u]).abs().mean()) for u, lp in got.items()
                 if u in self.engines]
        if moved:  # not at the first check: there is a last time to have changed from
            m["client/sync_check_engines_changed"] = sum(v > 0 for v in moved)
            m["client/sync_check_engine_change"] = min(moved)
        if self.trainer is not None:
            m["client/sync_check_trainer_change"] = float((want - self.trainer).abs().mean())
        self.engines.update(got)
        self.trainer = want
        m["client/sync_check_time"] = time.perf_counter() - start
        return m
