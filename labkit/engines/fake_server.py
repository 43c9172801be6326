"""A fake OpenAI-compatible engine server: made-up tokens at a set pace, for tests.

`labkit serve --backend fake` starts K of these behind the router, so the client, the
router's 503s and the trainer's weight sync can be tested without vLLM. Each engine answers
`/v1/completions` with vLLM's answer shape (token ids, log-probs), generates `--slots`
requests at a time for `--delay-s` each, and takes the trainer's weight sync
(`/collective_rpc` with labkit_load_weights, `/reset_prefix_cache`), printing one line per
weights file it read with the sum of its values, which a test can check.

    labkit fake-engine --port 8001 --delay-s 0.05 --slots 8
"""

from __future__ import annotations

from labkit.engines.served_sync import LOAD_WEIGHTS_METHOD


def fake_answer(body: dict, model: str, vocab_size: int = 1000) -> dict:
    """A vLLM-shaped /v1/completions answer with made-up tokens, seeded by prompt and seed;
    `n` choices (the first is the one a request for one answer gets)."""
    import random

    prompt = body.get("prompt") or [0]
    n_tok = int(body.get("max_tokens") or 16)
    key = (tuple(prompt) if isinstance(prompt, list) else prompt, body.get("seed"))
    choices = []
    for k in range(max(int(body.get("n") or 1), 1)):
        rng = random.Random(hash(key if k == 0 else (*key, k)))
        ids = [rng.randrange(1, vocab_size) for _ in range(n_tok)]
        choices.append({"index": k, "text": " ".join(f"t{i}" for i in ids), "finish_reason": "length",
                        "token_ids": ids, "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                                       "token_logprobs": [-6.9] * n_tok}})
    return {"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": choices}


def fake_load_weights(path: str) -> dict:
    """What the fake engine does with a weights file: count its tensors and sum their values."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    total = sum(float(t.double().sum()) for t in tensors.values())
    return {"tensors": len(tensors), "sum": total, "seconds": 0.0}


def run_fake_engine(port: int, *, host: str = "127.0.0.1", delay_s: float = 0.05, slots: int = 8,
                    vocab_size: int = 1000, served_model_name: str = "fake") -> int:
    """Serve a fake OpenAI-compatible engine until a signal: `slots` requests at a time,
    `delay_s` each (tests; `labkit fake-engine` starts it).

    It also takes the trainer's weight sync (/collective_rpc with labkit_load_weights,
    /reset_prefix_cache) and prints one line per weights file it read, with its sum."""
    import asyncio

    from aiohttp import web

    async def completions(request):
        body = await request.json()
        async with request.app["slots"]:
            await asyncio.sleep(delay_s)
        return web.json_response(fake_answer(body, served_model_name, vocab_size))

    async def collective_rpc(request):
        body = await request.json()
        if body.get("method") != LOAD_WEIGHTS_METHOD:
            return web.json_response({"error": f"fake engine: no method {body.get('method')!r}"},
                                     status=400)
        path = (body.get("kwargs") or {}).get("path", "")
        info = fake_load_weights(path)
        print(f"labkit fake engine: loaded {info['tensors']} tensors, sum {info['sum']!r}, "
              f"from {path}", flush=True)
        return web.json_response({"results": [info]})

    async def reset_prefix_cache(_):
        return web.Response(status=200)

    async def health(_):
        return web.Response(text="ok")

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": served_model_name, "object": "model"}]})

    async def on_startup(app):
        app["slots"] = asyncio.Semaphore(slots)

    app = web.Application()
    app.on_startup.append(on_startup)
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/v1/models", models), web.post("/collective_rpc", collective_rpc),
                    web.post("/reset_prefix_cache", reset_prefix_cache)])
    web.run_app(app, host=host, port=port, print=None, handle_signals=True)
    return 0
