"""Runs side by side: the reward gain and the rollout cost of each group size, from run folders.

The lessons' one import for comparing runs (`labkit.analysis.load_runs(...)`, then the gains,
the costs and the table). The work lives in one module per idea; this module re-exports it:

* labkit.runframe: `load_runs`, run folders and miles logs as one tidy frame (one row per
  run and step), with the heat columns that say which steps are clean;
* labkit.gains: `run_gains`, `group_gains`, the bootstrap interval and `inside_one_range`
  (is every gain inside the seed spread of the reference group size?);
* labkit.costs: `common_clean_steps` and `run_costs`, the median rollout time over the
  step numbers clean in every compared run;
* labkit.compare: `compare`, the course's table as display strings, `render_table`, and
  `compare_main`, the `labkit compare` command.
"""

from __future__ import annotations

from labkit.compare import check_comparable, compare, compare_main, drop_unfinished, render_table
from labkit.costs import common_clean_steps, run_costs
from labkit.gains import (EARLY, LATE, REFERENCE, Verdict, bootstrap_gain, group_gains,
                          inside_one_range, run_gains, window_rewards)
from labkit.metrics import STEP
from labkit.runframe import (CONFIG_COLUMNS, HEAT_CLEAN, METRIC_FALLBACK, MILES_INFO, MILES_LOG,
                             RESPONSE_LEN, REWARD, ROLLOUT_TIME, TOKENS, ZERO_STD, AnalysisError,
                             PathLike, Runs, as_runs, find_sources, load_runs, metric_values)

__all__ = [
    # loading (labkit.runframe)
    "load_runs", "find_sources", "as_runs", "metric_values", "AnalysisError", "Runs", "PathLike",
    "STEP", "REWARD", "ROLLOUT_TIME", "TOKENS", "RESPONSE_LEN", "ZERO_STD", "HEAT_CLEAN",
    "CONFIG_COLUMNS", "METRIC_FALLBACK", "MILES_LOG", "MILES_INFO",
    # the gain (labkit.gains)
    "run_gains", "group_gains", "window_rewards", "bootstrap_gain", "inside_one_range", "Verdict",
    "EARLY", "LATE", "REFERENCE",
    # the cost (labkit.costs)
    "common_clean_steps", "run_costs",
    # the table and the command (labkit.compare)
    "compare", "render_table", "check_comparable", "drop_unfinished", "compare_main",
]
