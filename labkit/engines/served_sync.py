"""The engine side of the HTTP weight sync: a vLLM worker extension that loads a weights file.

vLLM's server has no public endpoint that loads new weights from a file and then refreshes
what it derived from them. `labkit serve` therefore starts each vLLM engine with its dev
endpoints on and `--worker-extension-cls` set to labkit.serving.cluster.WORKER_EXTENSION,
this class's dotted path (vLLM imports it by that path in each worker, so the class must stay
importable from here); the trainer (labkit.engines.http) then calls LOAD_WEIGHTS_METHOD on
every worker through `/collective_rpc`. This module imports nothing heavy at the top: the
trainer and the fake engine read its names without vLLM installed.
"""

from __future__ import annotations

import time

LOAD_WEIGHTS_METHOD = "labkit_load_weights"  # the worker method /collective_rpc calls


class EngineWeightSync:
    """Mixed into each vLLM worker (`--worker-extension-cls`): load a weights file in place.

    `labkit_load_weights(path)` streams the tensors of one safetensors file (Hugging Face
    names, as `model.named_parameters()` gives them) through vLLM's `reload_weights`, which
    restores each layer to its checkpoint layout, loads, and re-runs its post-load
    processing in the original storage (CUDA graphs stay valid). On CPU a tied LM head is
    then re-processed by hand: it is never in the file, and its prepacked oneDNN copy would
    keep the old embedding (the same fix as labkit.engines.vllm). vLLM's plain
    `reload_weights(weights_path=...)` over /collective_rpc misses that, so it serves stale
    log-probs on CPU. Returns {"tensors", "seconds", "read_seconds"} to the trainer:
    read_seconds is the part spent taking the tensors from the file to the engine's device
    (the rest is vLLM's loading and post-processing).
    """

    def labkit_load_weights(self, path: str) -> dict:
        from safetensors import safe_open
        from vllm.platforms import current_platform

        from labkit.engines.vllm import RELOAD_LOGGER, quiet_logger, refresh_tied_heads

        start = time.perf_counter()
        model = self.model_runner.get_model()
        dtype, device = self.vllm_config.model_config.dtype, next(model.parameters()).device
        count, read_s = 0, 0.0

        def stream():
            nonlocal count, read_s
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    t = time.perf_counter()
                    tensor = f.get_tensor(name).to(device=device, dtype=dtype)
                    read_s += time.perf_counter() - t
                    count += 1
                    yield name, tensor

        with quiet_logger(RELOAD_LOGGER):
            self.reload_weights(weights_iterator=stream())
            if current_platform.is_cpu():
                refresh_tied_heads(model)
        if count == 0:
            raise ValueError(f"labkit_load_weights: {path} holds no tensors")
        return {"tensors": count, "seconds": round(time.perf_counter() - start, 3),
                "read_seconds": round(read_s, 3)}
