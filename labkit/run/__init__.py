"""A run's life on disk and in time: its folder (`log`), files written whole and read back
(`files`), one trainer per folder (`lock`), checkpoints (`checkpoint`), the time limit and
signals (`stopping`), the progress bar (`progress`) and the metric names (`metrics`)."""
