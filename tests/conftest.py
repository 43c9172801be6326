"""Shared fixtures: a tiny random causal LM with a character tokenizer, built offline."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from two threads, and OpenMP's spinning makes them crawl when
# the machine is busy (measured: a 2-step tiny run took 80 s with 2 threads under load, 6 s with 1).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_GSM8K = REPO / ".." / "shared" / "data" / "gsm8k"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(folder: Path, *, seed: int = 0, layers: int = 2, hidden: int = 32) -> Path:
    """Save a tiny random Llama and a character-level tokenizer with a chat template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.printable))
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=" "))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", unk_token=" ",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
        max_position_embeddings=2048, pad_token_id=0, eos_token_id=vocab["<|im_end|>"],
        bos_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def folder_with_a_labkit(tmp_path: Path, shadow: str) -> Path:
    """A folder holding something named labkit that is not the package: the folder that holds
    a checkout (`checkout`: a namespace package to Python) or another package (`package`)."""
    here = tmp_path / "home"
    (here / "labkit").mkdir(parents=True)
    if shadow == "package":
        (here / "labkit" / "__init__.py").write_text("raise ImportError('not the real labkit')\n")
    else:
        (here / "labkit" / "README.md").write_text("a checkout of labkit\n")
    return here


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def tiny_cfg(tiny_model_dir, tmp_path):
    """A 2-step run of the tiny model on synthetic problems, small enough for a unit test."""
    from labkit.config import RunConfig

    return RunConfig(
        model=str(tiny_model_dir), data="synthetic", engine="hf",
        rollout_batch_size=2, n_samples_per_prompt=4, global_batch_size=8, micro_batch_size=4,
        num_rollout=2, rollout_max_response_len=12, lr=1e-3, output_dir=str(tmp_path / "runs"),
        run_name="tiny", progress=False, seed=7, eval_split_size=0,
    )


@pytest.fixture(autouse=True)
def no_local_copies_named(monkeypatch):
    """LABKIT_MODEL and LABKIT_DATA change RunConfig's defaults; a test sets them itself."""
    monkeypatch.delenv("LABKIT_MODEL", raising=False)
    monkeypatch.delenv("LABKIT_DATA", raising=False)


@pytest.fixture(autouse=True)
def sigint_stops_as_in_a_terminal():
    """A test sends SIGINT as Ctrl-C or a notebook's stop button would; a CI runner or a shell's
    `cmd &` may have started the tests with SIGINT ignored, where it would reach nothing."""
    import signal

    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(autouse=True)
def nothing_kept_between_tests():
    """A run keeps its policy (and a vLLM engine) for the next run in the process; tests
    start from nothing kept."""
    yield
    from labkit.engines import keep

    keep.close()


@pytest.fixture(autouse=True)
def one_thread_again_after_each_test():
    """The suite's one thread again after a test that gave torch more, and labkit's memory of
    a count it lowered cleared: else a later run on a calmer machine raises its threads
    (labkit.machine.cpuload) and its sums differ from a child's on one thread."""
    yield
    from labkit.machine import cpuload

    cpuload._torch_default = None
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory):
    """The constructed course runs of tests/fixtures_runs.py, on disk."""
    from fixtures_runs import write_course_runs

    return write_course_runs(tmp_path_factory.mktemp("course"))


@pytest.fixture(scope="module")
def runs(course_dir):
    """The course runs read by load_runs (modules may define their own `runs`)."""
    from labkit.analysis.runframe import load_runs

    return load_runs(course_dir)


from fixtures_engines import served  # noqa: E402,F401  (a vLLM stand-in for runs: test_keep, test_overlap)
