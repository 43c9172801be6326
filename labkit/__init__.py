"""labkit: train a small model on GSM8K with GRPO, and see what the group size does.

    import labkit
    cfg = labkit.RunConfig.preset("cpu", n_samples_per_prompt=4, global_batch_size=16)
    run = labkit.launch(cfg)      # a Run: run.dir, run.metrics (DataFrame), run.status
    runs = labkit.launch_many([cfg.replace(n_samples_per_prompt=n, global_batch_size=4 * n)
                               for n in (2, 8)])   # side by side on the GPUs, in turn on a CPU
    labkit.close()                # release the model and engine kept for the next launch
"""

from labkit.config import ConfigError, RunConfig
from labkit.run.log import Run
from labkit.run.version import __version__


def launch(config: RunConfig, *, resume=None) -> Run:
    """Run GRPO with `config` (or continue the run folder `resume`); return the Run."""
    from labkit.trainer import train

    return train(config, resume=resume)


def launch_many(configs, *, resume: bool = False, gpus=None, mps: bool = False,
                stagger_starts: bool = False) -> list[Run]:
    """Run several configs: side by side on the GPUs (a process each, as many on each GPU as
    its free memory holds, the rest waiting for a place), one after another without one.
    `gpus=[0, 1]` limits the GPUs (also env LABKIT_GPUS). One stop stops them all after their
    step; `resume=True` continues named runs. `mps`, `stagger_starts`: as `labkit sweep`'s
    --mps and --stagger-starts. Returns the Runs (labkit.sweep)."""
    from labkit.sweep import launch_many as _launch_many

    return _launch_many(configs, resume=resume, gpus=gpus, mps=mps, stagger_starts=stagger_starts)


def close() -> None:
    """Release the policy and the vLLM engine that runs in this process keep for the next run
    (labkit.engines.keep), and say how much memory the process holds before and after; the
    next launch loads and starts them afresh."""
    from labkit.engines import keep

    before = keep.memory_in_use_gb()
    released = keep.close()
    after = keep.memory_in_use_gb()
    what = "released the kept model (and engine)" if released else "nothing was kept"
    memory = (f"; this process holds {after:.1f} GB of memory (was {before:.1f} GB)"
              if before is not None and after is not None else "")
    print(f"labkit: {what}{memory}", flush=True)


__all__ = ["ConfigError", "Run", "RunConfig", "close", "launch", "launch_many", "__version__"]
