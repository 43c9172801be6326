"""miles backend: the labkit recipe as a miles launch script, and miles' logs read back.

The course's recipe comes from miles (github.com/radixark/miles, a sibling of THUDM/slime:
SGLang rollouts, Megatron training, Ray). `labkit launch --backend miles` writes the same
recipe as a bash script for a GPU cluster, and `read_miles_log` turns what miles printed
into the frame labkit's own runs give, so the lessons' tables and plots read both. This
package's `__init__` is its public face (`labkit.miles.render_script`, `labkit.miles.read_miles_log`, and
`labkit.miles.miles_reward`, the reward hook the script names); the work lives in one
module per idea:

* labkit.miles.command: a RunConfig as miles' train.py flags, the knobs miles cannot take
  (refused by name, or ignored and said), what becomes of those it takes in another form,
  and where the recipe departs from miles' defaults;
* labkit.miles.backend: the run folder (run_miles.sh, the prompt files, labkit_miles.json),
  `labkit launch --backend miles` itself, and the reward hook miles calls back;
* labkit.miles.log: miles' stdout log or wandb export as labkit's metric names.
"""

from __future__ import annotations

from labkit.miles.backend import (
                                  EVAL_PROMPTS,
                                  MODEL_TYPES,
                                  PROMPTS,
                                  PROVENANCE,
                                  SCRIPT,
                                  custom_rm_file,
                                  default_run_dir,
                                  launch,
                                  miles_reward,
                                  ordered_problems,
                                  read_prompt_data,
                                  render_script,
                                  write_prompt_data,
                                  write_run_folder,
)
from labkit.miles.command import (
                                  EVAL_NAME,
                                  HTTP_ROLLOUTS,
                                  IGNORED,
                                  INPUT_KEY,
                                  LABEL_KEY,
                                  MILES_DEFAULTS,
                                  MILES_FLAGS_HELP,
                                  REWARD_HOOK,
                                  UNSET_MEANS,
                                  UNSUPPORTED,
                                  MilesUnsupported,
                                  build_command,
                                  default_differences,
                                  entry_point,
                                  flag_notes,
                                  format_differences,
                                  parse_train_args,
                                  refuse_unsupported,
                                  total_gpus,
)
from labkit.miles.log import CONFIG_FLAGS, LOG, TRAIN_ARGS, parse_log_dict, read_miles_log, to_labkit_metrics

__all__ = [
    # the command (labkit.miles.command)
    "build_command", "refuse_unsupported", "MilesUnsupported", "parse_train_args",
    "default_differences", "format_differences", "UNSUPPORTED", "HTTP_ROLLOUTS",
    "IGNORED", "flag_notes", "MILES_FLAGS_HELP", "entry_point", "total_gpus",
    "MILES_DEFAULTS", "UNSET_MEANS", "INPUT_KEY", "LABEL_KEY", "EVAL_NAME", "REWARD_HOOK",
    # the backend: script, prompts, reward hook, launch (labkit.miles.backend)
    "launch", "render_script", "write_run_folder", "default_run_dir", "write_prompt_data",
    "read_prompt_data", "ordered_problems", "miles_reward", "custom_rm_file", "SCRIPT", "PROMPTS",
    "EVAL_PROMPTS",
    "PROVENANCE", "MODEL_TYPES",
    # the logs (labkit.miles.log)
    "read_miles_log", "parse_log_dict", "to_labkit_metrics", "LOG", "TRAIN_ARGS", "CONFIG_FLAGS",
]
