"""Each held-out problem's outcome, one line per evaluation in `eval_outcomes.jsonl`.

`eval.jsonl` keeps an evaluation's accuracy; this file keeps what it was made of: for every
problem, whether the greedy answer was right, and the answer's length in tokens. Before and
after training are the same problems, and so are the evaluations of two runs on one test
split, so a change can be read problem by problem (a paired comparison: labkit.analysis.paired)
instead of as two independent accuracies, each with its own binomial error.

One line per evaluation, small enough to commit with a run (1,319 GSM8K problems: ~7 KB)::

    {"eval/trained_steps": 24, "name": "eval/gsm8k_test", "ids": "gsm8k/test/0-1318",
     "right": "0110...", "response_len": [212, 97, ...]}

`ids` is `<source>/<split>/<first>-<last>` when the problems are rows first..last of one
split, in order (a run evaluates the first --eval-split-size test problems), else the list of
ids; `right` has one character per problem, "1" right and "0" not. The line is written
before the evaluation's row in eval.jsonl, so a run killed between the two evaluates again
when resumed and writes a second line for the same step: a reader takes the last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from labkit.run.files import readable_rows

OUTCOMES = "eval_outcomes.jsonl"
_RANGE_RE = re.compile(r"(.+)/(\d+)-(\d+)\Z")


@dataclass(frozen=True)
class Outcomes:
    """One evaluation, problem by problem: `ids[i]` was answered right (`right[i]`) in
    `response_len[i]` tokens."""

    trained_steps: int
    name: str
    ids: tuple[str, ...]
    right: tuple[bool, ...]
    response_len: tuple[int, ...]

    @property
    def accuracy(self) -> float:
        return sum(self.right) / max(len(self.right), 1)


def outcome_row(trained_steps: int, name: str, ids: list[str], right: list[bool],
                response_len: list[int]) -> dict:
    """The line of eval_outcomes.jsonl for one evaluation (see the module's docstring)."""
    if not len(ids) == len(right) == len(response_len):
        raise ValueError(f"{len(ids)} ids, {len(right)} outcomes and {len(response_len)} lengths")
    return {"eval/trained_steps": trained_steps, "name": name, "ids": pack_ids(ids),
            "right": "".join("1" if r else "0" for r in right),
            "response_len": [int(n) for n in response_len]}


def pack_ids(ids: list[str]) -> str | list[str]:
    """`source/split/first-last` for rows first..last of one split in order, else the list."""
    if not ids:
        return []
    parts = [i.rsplit("/", 1) for i in ids]
    prefix = parts[0][0]
    if all(len(p) == 2 and p[0] == prefix and p[1].isdigit() for p in parts):
        first = int(parts[0][1])
        if [int(p[1]) for p in parts] == list(range(first, first + len(ids))):
            return f"{prefix}/{first}-{first + len(ids) - 1}"
    return list(ids)


def unpack_ids(packed) -> tuple[str, ...]:
    """The problem ids of a line's `ids` (pack_ids reversed); ValueError for anything else."""
    if isinstance(packed, list) and all(isinstance(i, str) for i in packed):
        return tuple(packed)
    m = _RANGE_RE.match(packed) if isinstance(packed, str) else None
    if m is None or int(m.group(3)) < int(m.group(2)):
        raise ValueError(f"not a list of problem ids: {str(packed)[:60]!r}")
    return tuple(f"{m.group(1)}/{k}" for k in range(int(m.group(2)), int(m.group(3)) + 1))


def parse_outcomes(row: dict) -> Outcomes:
    """A line of eval_outcomes.jsonl as Outcomes; ValueError (or KeyError, TypeError) when it
    is not one."""
    ids, right, lengths = unpack_ids(row["ids"]), row["right"], row["response_len"]
    if not (isinstance(right, str) and set(right) <= {"0", "1"}
            and len(right) == len(ids) == len(lengths)):
        raise ValueError("the outcomes do not match the problem ids")
    return Outcomes(int(row["eval/trained_steps"]), str(row["name"]), ids,
                    tuple(c == "1" for c in right), tuple(int(n) for n in lengths))


def read_outcomes(run_dir: str | Path) -> dict[int, Outcomes]:
    """A run folder's per-problem outcomes by trained steps (the last line of each step: see
    the module's docstring); empty for a run evaluated before they were kept, or never.
    Lines that cannot be read are left out (a RunLogError for a file that is there but
    cannot be read at all, as for every file of a run)."""
    found: dict[int, Outcomes] = {}
    for row in readable_rows(Path(run_dir) / OUTCOMES):
        try:
            outcomes = parse_outcomes(row)
        except (ValueError, KeyError, TypeError):
            continue
        found[outcomes.trained_steps] = outcomes
    return found
