"""The `/v1/completions` side of the engine interface: a rollout's requests, and the
Completions in their answers.

`build_requests` turns prompt token ids and a `Sampling` into requests, one per answer (or
with `per_prompt` one per prompt asking for its n answers); `parse_completion` and
`parse_completions` turn an answer back into Completions, refusing (BadAnswer) what cannot
be used: missing choices, unreadable token ids, ids outside the trainer's vocabulary.
labkit.serving.client sends the requests and retries them; labkit.engines.http joins the two.
"""

from __future__ import annotations

from labkit.engines.base import Completion, Sampling
from labkit.serving.client import BadAnswer


def build_requests(prompt_ids: list[list[int]], sampling: Sampling, model: str | None,
                   step: int, seeded: bool = False, tag: str | None = None,
                   per_prompt: bool = False) -> list[tuple[str, str, dict]]:
    """The (request_id, path, payload) requests of a rollout, prompt-major.

    One per answer (n=1, ids `s{step}-p{prompt}-a{answer}`): a router spreads the answers of
    one prompt over its engines, and a lost answer is retried alone. `per_prompt`: one per
    prompt asking for all its answers (`n`, ids `s{step}-p{prompt}`): an eighth of the
    requests at 8 answers a prompt, each engine samples a group together, and a lost request
    is retried whole. `tag` replaces `s{step}`, e.g. `s3-eval` for the evaluation inside step 3.
    """
    tag = tag or f"s{step}"
    n = sampling.n if per_prompt else 1
    requests = []
    for i, ids in enumerate(prompt_ids):
        for j in range(0, sampling.n, n):
            payload = {
                "prompt": list(map(int, ids)), "n": n, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p,
                "logprobs": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
            }
            if model:
                payload["model"] = model
            if seeded and sampling.seed is not None:
                payload["seed"] = sampling.seed + i * sampling.n + j
            if sampling.stop_token_ids:
                payload["stop_token_ids"] = list(sampling.stop_token_ids)
            rid = f"{tag}-p{i}" if per_prompt else f"{tag}-p{i}-a{j}"
            requests.append((rid, "/v1/completions", payload))
    return requests


def parse_completions(answer: dict, n: int, prompt_index: int, request_id: str, tokenizer=None,
                      vocab_size: int | None = None) -> list[Completion]:
    """The n Completions of one `/v1/completions` answer to a request for n answers, in the
    order of their `index`. BadAnswer (retried) unless it holds exactly n choices."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        got = len(choices) if isinstance(choices, list) else "no"
        raise BadAnswer("bad_answer", f"asked for {n} answers, got {got} choices: {str(answer)[:200]}")

    def index(k: int) -> int:
        i = choices[k].get("index")
        return i if isinstance(i, int) else k

    return [parse_completion(answer, prompt_index, request_id, tokenizer, vocab_size, choice=k)
            for k in sorted(range(n), key=index)]


def parse_completion(answer: dict, prompt_index: int, request_id: str, tokenizer=None,
                     vocab_size: int | None = None, choice: int = 0) -> Completion:
    """A Completion from one `/v1/completions` answer (its choice number `choice`, the first
    by default). Raises BadAnswer for an answer without that choice, unreadable token ids,
    or (not retried) ids outside `vocab_size`."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) <= choice or not isinstance(choices[choice], dict):
        raise BadAnswer("bad_answer", f"the answer has no choices: {str(answer)[:200]}")
    choice = choices[choice]
    lp = choice.get("logprobs") or {}
    token_ids = choice.get("token_ids")
    try:
        if token_ids is None and lp.get("tokens") is not None:
            token_ids = [int(str(t).rsplit(":", 1)[-1]) for t in lp["tokens"]]
        token_ids = None if token_ids is None else [int(t) for t in token_ids]
        logprobs = lp.get("token_logprobs")
        logprobs = [float(x) for x in logprobs] if logprobs else None
    except (TypeError, ValueError, AttributeError) as e:
        raise BadAnswer("bad_answer", f"unreadable token ids or log-probs ({e})") from None
    if token_ids is None and tokenizer is not None:
        token_ids = tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
    if token_ids is None:
        raise BadAnswer("no_token_ids", "the engine returned no token ids; use a vLLM that "
                        "supports return_token_ids, or pass a tokenizer", retry=False)
    if vocab_size is not None and any(not 0 <= t < vocab_size for t in token_ids):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise BadAnswer("out_of_vocabulary", (
            f"the engine serving {answer.get('model', 'an unnamed model')!r} answered token id "
            f"{bad}, outside the trainer's vocabulary of {vocab_size:,}: the engines serve "
            f"another model than the trainer's --model; start them with the same model"),
            retry=False)
    if logprobs is not None and len(logprobs) != len(token_ids):
        raise BadAnswer("bad_answer", f"{len(token_ids)} token ids but {len(logprobs)} log-probs")
    return Completion(prompt_index=prompt_index, token_ids=token_ids,
                      text=choice.get("text", ""), finish_reason=choice.get("finish_reason") or "stop",
                      logprobs=logprobs)
