"""A run's life on disk and in time: its folder (`log`), files written whole and read back
(`files`), one trainer per folder (`lock`), checkpoints (`checkpoint`), the time limit and
signals (`stopping`), the progress bar (`progress`), the metric names (`metrics`), the
labkit version a folder records (`version`), and what a sweep's runs share as they start
(`start_results`, `ready`)."""
