"""Runs side by side: the reward gain and the rollout cost of each group size, from run folders.

The lessons' one import for comparing runs (`labkit.analysis.load_runs(...)`, then the gains,
the costs, the table and the plots). The work lives in one module per idea; this package's
face re-exports it:

* labkit.analysis.runframe: `load_runs`, run folders and miles logs as one tidy frame (one row per
  run and step), with the heat columns that say which steps are clean, and how each run ended
  (`status_text`: "stopped after step 1"); constructed (made-up) runs only when asked;
* labkit.analysis.gains: `run_gains`, `group_gains`, the bootstrap interval and `inside_one_range`
  (is every gain inside the seed spread of the reference group size?), and
  `refuse_mixed_settings` (runs of one group size must be seeds of one setting);
* labkit.analysis.heldout: `heldout_change`, `heldout_gains`, `group_heldout`, test accuracy
  before and after training (eval.jsonl, eval_outcomes.jsonl), per run and per setting;
* labkit.analysis.paired: `paired_change`, `setting_change`, `difference`, the paired
  intervals (problem by problem, and over seeds) that the held-out tables and verdicts read;
* labkit.analysis.costs: `common_clean_steps` and `run_costs`, the median rollout time over the
  step numbers clean in every compared run;
* labkit.analysis.table: `compare`, the course's table as display strings, and `render_table`;
* labkit.analysis.plots: `reward_curve`, `rollout_time_curve`, `response_length_curve`,
  `zero_std_curve`, `heldout_plot`, and `plot_all` (every figure as PNG and SVG).
"""

from __future__ import annotations

from labkit.analysis.costs import common_clean_steps, run_costs
from labkit.analysis.gains import (
                                   EARLY,
                                   LATE,
                                   REFERENCE,
                                   SETTINGS,
                                   Verdict,
                                   bootstrap_gain,
                                   end_windows,
                                   group_gains,
                                   inside_one_range,
                                   refuse_mixed_settings,
                                   reward_at_ends,
                                   reward_parts,
                                   reward_rise,
                                   rise_windows,
                                   run_gains,
                                   window_rewards,
)
from labkit.analysis.heldout import (
                                   group_heldout,
                                   heldout_change,
                                   heldout_gains,
                                   heldout_line,
                                   heldout_verdict,
                                   read_evaluations,
)
from labkit.analysis.paired import Interval, RunChange, difference, paired_change, setting_change
from labkit.analysis.plots import (
                                   heldout_plot,
                                   plot_all,
                                   response_length_curve,
                                   reward_curve,
                                   rollout_time_curve,
                                   save_figure,
                                   zero_std_curve,
)
from labkit.analysis.runframe import (
                                   CONFIG_COLUMNS,
                                   CONSTRUCTED,
                                   HEAT_CLEAN,
                                   METRIC_FALLBACK,
                                   MILES_INFO,
                                   MILES_LOG,
                                   RESPONSE_LEN,
                                   REWARD,
                                   RIGHT,
                                   ROLLOUT_TIME,
                                   TOKENS,
                                   ZERO_STD,
                                   AnalysisError,
                                   PathLike,
                                   Runs,
                                   as_runs,
                                   find_sources,
                                   is_constructed,
                                   is_stopped,
                                   load_runs,
                                   metric_values,
                                   status_text,
                                   steps_text,
                                   with_steps,
)
from labkit.analysis.table import check_comparable, compare, drop_unfinished, render_table
from labkit.run.metrics import STEP

__all__ = [
    # loading (labkit.analysis.runframe)
    "load_runs", "with_steps", "find_sources", "as_runs", "metric_values", "AnalysisError", "Runs",
    "PathLike", "steps_text",
    "is_constructed", "CONSTRUCTED", "is_stopped", "status_text",
    "STEP", "REWARD", "RIGHT", "ROLLOUT_TIME", "TOKENS", "RESPONSE_LEN", "ZERO_STD", "HEAT_CLEAN",
    "CONFIG_COLUMNS", "METRIC_FALLBACK", "MILES_LOG", "MILES_INFO",
    # the gain (labkit.analysis.gains)
    "run_gains", "group_gains", "window_rewards", "bootstrap_gain", "inside_one_range", "Verdict",
    "EARLY", "LATE", "REFERENCE", "SETTINGS", "refuse_mixed_settings",
    "reward_at_ends", "reward_parts", "end_windows", "reward_rise", "rise_windows",
    # held-out accuracy (labkit.analysis.heldout)
    "heldout_gains", "group_heldout", "heldout_verdict", "read_evaluations", "heldout_change",
    "heldout_line",
    # paired intervals (labkit.analysis.paired)
    "paired_change", "setting_change", "difference", "Interval", "RunChange",
    # the cost (labkit.analysis.costs)
    "common_clean_steps", "run_costs",
    # the table and the command (labkit.analysis.table)
    "compare", "render_table", "check_comparable", "drop_unfinished",
    # the figures (labkit.analysis.plots)
    "reward_curve", "rollout_time_curve", "response_length_curve", "zero_std_curve",
    "heldout_plot", "plot_all", "save_figure",
]
