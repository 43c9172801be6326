"""labkit: train a small model on GSM8K with GRPO, and see what the group size does.

    import labkit
    cfg = labkit.RunConfig.preset("cpu", n_samples_per_prompt=4, global_batch_size=16)
    run = labkit.launch(cfg)      # a Run: run.dir, run.metrics (DataFrame), run.status
"""

__version__ = "0.1.0"

from labkit.config import ConfigError, RunConfig  # noqa: E402
from labkit.runlog import Run  # noqa: E402


def launch(config: RunConfig, *, resume=None) -> Run:
    """Run GRPO with `config` (or continue the run folder `resume`); return the Run."""
    from labkit.trainer import train

    return train(config, resume=resume)


__all__ = ["ConfigError", "Run", "RunConfig", "launch", "__version__"]
