"""Problems: GSM8K or made-up word problems, their numeric labels, and the prompt order.

A run needs three things from its data: problems with a label the reward can check, a
prompt that asks for the answer in the form the reward reads (`#### 42`), and an order
of prompts that depends only on (seed, step), so a resumed run sees the same prompts as
an unbroken one. GSM8K comes from the hub through `datasets` (optional), or from a local
folder of jsonl/parquet for machines with no internet. The synthetic problems are
labkit's own, GSM8K-shaped, correct by construction and with a difficulty knob (the
number of steps), so the embedded CPU model has something it can learn in minutes.
"""

from __future__ import annotations

import functools
import json
import random
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from labkit.config import MAX_SYNTHETIC_STEPS, ConfigError, given_as
from labkit.errors import DataError
from labkit.reward import parse_number

SYSTEM_PROMPT = (
    "You solve grade-school math word problems. Reason step by step, then write the final "
    "answer as a number on the last line, after '#### ', for example:\n#### 42"
)
SYNTHETIC_SIZES = {"train": 5000, "test": 500}  # problems when `n` is not given
# The most a synthetic split holds (GSM8K: 7,473 train, 1,319 test): a larger `n` gets
# them all (writing 10**20 distinct problems would never end).
SYNTHETIC_SPLIT_MAX = 10_000

# Worked examples a prompt may show before its question (`--prompt-examples K`), as earlier
# turns of the chat: made-up problems of the synthetic kind, answered in the asked format.
# A 135M model rarely writes `#### <number>` from the instruction alone (SmolLM2-135M: 9% of
# sampled answers on GSM8K, 15% on one-step made-up problems); after these turns it does in
# ~90% (BENCHMARKS.md, "the CPU run that learns").
EXAMPLES = [
    ("Sam has 12 pens. He buys 5 more pens. How many pens does Sam have now?", "12 + 5 = 17\n#### 17"),
    ("Lena has 30 shells. She gives away 8 shells to Max. How many shells does Lena have now?",
     "30 - 8 = 22\n#### 22"),
    ("Max has 7 cards. Then he ends up with 3 times as many cards as before. How many cards "
     "does Max have now?", "7 * 3 = 21\n#### 21"),
    ("Ana has 24 beads. She splits the beads into 4 equal groups and keeps one group. How many "
     "beads does Ana have now?", "24 / 4 = 6\n#### 6"),
]


@dataclass(frozen=True)
class Problem:
    """One prompt: `id` is source/split/row ("gsm8k/train/123"), `label` a number as text."""

    id: str
    question: str
    label: str


def build_messages(question: str, examples: int = 0) -> list[dict]:
    """Chat messages for one problem: the system prompt (reason, then `#### <answer>`), the
    first `examples` worked EXAMPLES as earlier user/assistant turns, and the question as
    the user's turn."""
    if not 0 <= examples <= len(EXAMPLES):
        raise ValueError(f"examples={examples}: labkit has {len(EXAMPLES)} worked examples")
    shown = [{"role": role, "content": text} for q, a in EXAMPLES[:examples]
             for role, text in (("user", q), ("assistant", a))]
    return [{"role": "system", "content": SYSTEM_PROMPT}, *shown, {"role": "user", "content": question}]


def prompt_token_ids(tokenizer, question: str, examples: int = 0) -> list[int]:
    """The chat prompt of a question (after `examples` worked examples) as token ids, ready
    for the assistant's answer."""
    messages = build_messages(question, examples)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # a bare tokenizer (tiny test models): plain text with the same instructions
    text = "\n\n".join(m["content"] for m in messages) + "\n\nAnswer:"
    return list(tokenizer(text)["input_ids"])


def fit_prompt(tokenizer, problem: Problem, ids: list[int], context: int | None,
               max_response_len: int, *, truncate: bool = False, examples: int = 0) -> list[int]:
    """`ids` (the prompt of `problem`) when they leave room for `max_response_len` answer
    tokens in `context` (None: no limit known); else the question's end is cut (`truncate`)
    or DataError names the problem and the fix.

    Why: a 1 MB question became a 330,060-token prompt, and the process was killed for
    memory during the rollout, with no message and no status."""
    if context is None or len(ids) + max_response_len <= context:
        return ids
    limit = context - max_response_len
    if limit < 1:
        raise ConfigError(f"--rollout-max-response-len {max_response_len:,} leaves no room for a "
                          f"prompt in the model's context of {context:,} tokens")
    if not truncate:
        raise DataError(
            f"prompt {problem.id} is {len(ids):,} tokens, and the model's context of {context:,} "
            f"leaves {limit:,} for a prompt after --rollout-max-response-len "
            f"{max_response_len:,}; remove or shorten that problem, lower "
            f"--rollout-max-response-len, or pass --long-prompts truncate")
    try:
        cut = truncated_prompt_ids(tokenizer, problem.question, limit, examples)
    except ValueError as e:
        raise DataError(f"prompt {problem.id}: {e} (context {context:,} tokens minus "
                        f"--rollout-max-response-len {max_response_len:,})") from None
    print(f"labkit: prompt {problem.id} cut from {len(ids):,} to {len(cut):,} tokens "
          f"(--long-prompts truncate)", flush=True)
    return cut


def truncated_prompt_ids(tokenizer, question: str, max_tokens: int, examples: int = 0) -> list[int]:
    """The chat prompt of `question` with the question's end cut, so that it has at most
    `max_tokens` tokens; ValueError when even an empty question does not fit."""
    ids = prompt_token_ids(tokenizer, question, examples)
    words = tokenizer(question, add_special_tokens=False)["input_ids"]
    keep = len(words)
    for _ in range(20):  # a cut can re-tokenize a little longer: trim by the excess, again
        if len(ids) <= max_tokens:
            return ids
        keep -= len(ids) - max_tokens
        if keep <= 0:
            raise ValueError(f"the prompt's instructions alone take more than {max_tokens} tokens")
        ids = prompt_token_ids(tokenizer, tokenizer.decode(words[:keep]), examples)
    raise ValueError(f"could not cut the prompt to {max_tokens} tokens")


def extract_label(answer: str) -> str | None:
    """The label of a GSM8K answer: the text after its last `#### `, commas removed,
    stripped; None when there is no such line or it is empty."""
    if not isinstance(answer, str) or "####" not in answer:
        return None
    label = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return label or None


# ------------------------------------------------------------------ loading
def load_problems(
    spec: str, split: str = "train", *, seed: int = 0, synthetic_steps: int = 2,
    n: int | None = None,
) -> list[Problem]:
    """Problems of `split` from `spec`: "gsm8k" (openai/gsm8k on the hub), "synthetic"
    (labkit's generator; `seed`, `synthetic_steps`), a folder with train/test jsonl or
    parquet files, or one .jsonl/.parquet file. Returns the first `n` (all if None)."""
    if spec == "synthetic":
        size = min(n, SYNTHETIC_SPLIT_MAX) if n is not None else SYNTHETIC_SIZES.get(split, 500)
        return synthetic_problems(size, synthetic_steps, seed, split)
    if spec == "gsm8k":
        rows = ((f"row {i}", row) for i, row in enumerate(_hub_rows(split)))
        source, where = "gsm8k", "openai/gsm8k"
    else:
        path = Path(spec).expanduser()
        files = _local_files(path, split)
        source = path.resolve().name if path.is_dir() else path.stem
        rows, where = _read_rows(files), str(path)
    problems = _problems_from_rows(rows, source, split, where)
    return problems[:n] if n is not None else problems


def split_eval(spec: str, n: int | None, *, synthetic_steps: int = 2) -> list[Problem]:
    """The held-out problems for evaluation: the first `n` of the test split (None: all), the
    same for every run and seed (synthetic test problems use seed 0), so runs compare fairly."""
    path = Path(spec).expanduser()
    if spec not in ("gsm8k", "synthetic") and path.is_file():
        given = given_as("data", spec, repr(spec))  # --data 'x', or LABKIT_DATA='x'
        raise DataError(f"{given} is one file, so it has no held-out test split; "
                        f"pass a folder with train.jsonl and test.jsonl, or --eval-split-size 0 "
                        f"(with --backend miles: --eval-interval 0)")
    return load_problems(spec, "test", seed=0, synthetic_steps=synthetic_steps, n=n)


def _hub_rows(split: str) -> Iterable[dict]:
    """Rows of openai/gsm8k (config main) through `datasets`, with errors that name the fix."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "--data gsm8k loads openai/gsm8k through the `datasets` package, which is not "
            "installed: pip install 'labkit[hub]', or pass a local folder with train.jsonl "
            "and test.jsonl (--data path/to/gsm8k, or LABKIT_DATA=path/to/gsm8k as the "
            "default), or --data synthetic"
        ) from None
    try:
        return datasets.load_dataset("openai/gsm8k", "main", split=split)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(
            f"--data gsm8k: could not load openai/gsm8k split {split!r} from the hub "
            f"({type(e).__name__}: {first[:200]}); offline (no internet), pass a local folder "
            f"with train.jsonl and test.jsonl (--data path/to/gsm8k, or LABKIT_DATA="
            f"path/to/gsm8k as the default), or --data synthetic"
        ) from e


def _local_files(path: Path, split: str) -> list[Path]:
    """The files that hold `split`: folder/{split}.jsonl, else folder/{split}*.parquet
    (also under folder/main/, the hub's layout), or the file itself."""
    given = given_as("data", path, repr(str(path)))  # --data 'x', or LABKIT_DATA='x'
    if path.is_file():
        if path.suffix not in (".jsonl", ".parquet"):
            raise DataError(f"{given}: use a .jsonl or .parquet file")
        return [path]
    if not path.is_dir():
        raise DataError(
            f"{given}: no such file or folder; use gsm8k, synthetic, a folder "
            f"with train.jsonl/test.jsonl (or train*.parquet/test*.parquet), or one such file"
        )
    for folder in (path, path / "main"):
        if (folder / f"{split}.jsonl").is_file():
            return [folder / f"{split}.jsonl"]
        if shards := sorted(folder.glob(f"{split}*.parquet")):
            return shards
    raise DataError(
        f"{given}: found no {split}.jsonl or {split}*.parquet in the folder"
    )


class BadLine(str):
    """A jsonl line that is not JSON, in place of its row (its text is why it is skipped)."""


def _read_rows(files: list[Path]) -> Iterable[tuple[str, object]]:
    """(where, row) for the rows of jsonl or parquet files in order; `where` names the file
    and line (or row). A jsonl line that is not JSON gives a BadLine; a line that is not
    UTF-8 stops the load with a DataError naming the file and line."""
    for file in files:
        if file.suffix == ".parquet":
            yield from _parquet_rows(file)
            continue
        with open(file, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{file} line {number}: not UTF-8 text ({e.reason} at byte {e.start} of "
                        f"the line); save the file as UTF-8") from None
                if not line.strip():
                    continue
                where = f"{file.name} line {number}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError:
                    yield where, BadLine("not JSON")


def _parquet_rows(file: Path) -> Iterable[tuple[str, object]]:
    import pandas as pd

    try:
        frame = pd.read_parquet(file)
    except Exception as e:  # pyarrow's errors have many classes
        raise DataError(f"{file}: not a parquet file that can be read ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from e
    missing = {"question", "answer"} - set(frame.columns)
    if missing:
        raise DataError(f"{file}: no column {', '.join(sorted(missing))}; "
                        f"found {', '.join(map(str, frame.columns))}")
    for k, row in enumerate(frame[["question", "answer"]].to_dict("records")):
        yield f"{file.name} row {k}", row


def _problems_from_rows(rows: Iterable[tuple[str, object]], source: str, split: str,
                        where: str) -> list[Problem]:
    """Problems from (place, row) pairs; the id keeps the row's index in the source.
    Malformed rows are counted and skipped with one warning naming the first few places."""
    problems, skipped, places, total = [], Counter(), {}, 0
    for i, (place, row) in enumerate(rows):
        total += 1
        reason = _row_problem(row)
        if reason:
            skipped[reason] += 1
            places.setdefault(reason, []).append(str(place))
            continue
        label = extract_label(row["answer"])
        problems.append(Problem(f"{source}/{split}/{i}", row["question"].strip(), label))
    why = "; ".join(f"{count} {reason} ({_places(places[reason])})"
                    for reason, count in skipped.most_common())
    if not problems:
        raise DataError(f"{where} ({split}): no usable rows of {total}"
                        f"{': ' + why if why else ''}; each row needs a question and an answer "
                        f"whose last line is '#### <number>'")
    if skipped:
        warnings.warn(f"{where} ({split}): skipped {sum(skipped.values())} of {total} rows ({why})",
                      stacklevel=3)
    return problems


def _places(places: list[str], shown: int = 3) -> str:
    more = f" and {len(places) - shown} more" if len(places) > shown else ""
    return ", ".join(places[:shown]) + more


def _row_problem(row) -> str | None:
    """Why a row cannot be a problem (None when it can)."""
    if isinstance(row, BadLine):
        return str(row)
    if not isinstance(row, dict):
        return "not a JSON object"
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        return "no question"
    label = extract_label(answer)
    if label is None:
        return "no '#### ' answer line"
    if parse_number(label) is None:
        return "label not a number"
    return None


# ------------------------------------------------------------------ prompt order
@functools.lru_cache(maxsize=8)
def _epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"labkit-order/{seed}/{epoch}").shuffle(order)
    return tuple(order)


def rollout_problems(problems: list[Problem], step: int, batch_size: int, seed: int) -> list[Problem]:
    """The `batch_size` problems of rollout `step`: batches taken in order from a seeded
    permutation per epoch, wrapping into the next epoch's permutation. Depends only on
    (problems, step, batch_size, seed), so a resumed run gets the same prompts."""
    if not problems:
        raise ValueError("rollout_problems: no problems to draw from")
    if batch_size < 1 or step < 0:
        raise ValueError(f"rollout_problems: need batch_size >= 1 and step >= 0, "
                         f"got {batch_size} and {step}")
    n = len(problems)
    start = step * batch_size
    return [problems[_epoch_order(n, seed, g // n)[g % n]] for g in range(start, start + batch_size)]


# ------------------------------------------------------------------ synthetic problems
NAMES = ["Maya", "Liam", "Aisha", "Tom", "Sofia", "Kenji", "Olga", "Diego", "Priya", "Noah",
         "Fatima", "Lucas", "Mei", "Omar", "Hannah", "Ravi", "Zoe", "Ivan", "Amara", "Ben"]
PRONOUNS = {n: ("She" if n in {"Maya", "Aisha", "Sofia", "Olga", "Priya", "Fatima", "Mei",
                               "Hannah", "Zoe", "Amara"} else "He") for n in NAMES}
ITEMS = ["apples", "stickers", "marbles", "pencils", "books", "cookies", "stamps", "shells",
         "cards", "coins", "balloons", "buttons", "crayons", "eggs", "beads", "toy cars"]
MAX_VALUE = 1000  # no intermediate amount grows past this

# One sentence per operation. Each template names its operation with a fixed phrase
# ("more", "gives away"/"loses"/"sells", "times as many", "equal"), so a reader (and the
# tests) can recompute the answer from the text alone.
TEMPLATES = {
    "add": ["{P} buys {k} more {item}.", "{P} finds {k} more {item}.",
            "{friend} hands {o} {k} more {item}."],
    "sub": ["{P} gives away {k} {item} to {friend}.", "{P} loses {k} {item}.",
            "{P} sells {k} {item}."],
    "mul": ["Then {p} ends up with {k} times as many {item} as before."],
    "div": ["{P} splits the {item} into {k} equal groups and keeps one group."],
}


def synthetic_problems(n: int, steps: int, seed: int, split: str = "train") -> list[Problem]:
    """`n` seeded word problems of `steps` operations each (+, -, x, / with whole results);
    `steps=0` is the easiest level: one addition or subtraction, numbers up to 20.
    Same (n, steps, seed, split), same problems. A problem's split is fixed by a hash of
    its text (1 in 10 is test), so train and test never share a problem whatever `n`."""
    if not 0 <= steps <= MAX_SYNTHETIC_STEPS or n < 0:
        raise ValueError(f"synthetic problems need steps from 0 to {MAX_SYNTHETIC_STEPS} and "
                         f"n >= 0, got {steps}, {n}")
    rng = random.Random(f"labkit-synthetic/{split}/{seed}/{steps}")
    seen: set[str] = set()
    problems: list[Problem] = []
    for _ in range(50 * n + 1000):
        if len(problems) == n:
            break
        question, answer = _write_problem(rng, steps)
        if question in seen or (zlib.crc32(question.encode()) % 10 == 0) != (split == "test"):
            continue
        seen.add(question)
        problems.append(Problem(f"synthetic/{split}/{len(problems)}", question, str(answer)))
    if len(problems) < n:
        raise ValueError(f"could not write {n} distinct synthetic problems with {steps} steps; "
                         f"ask for fewer or use more steps")
    return problems


def _write_problem(rng: random.Random, steps: int) -> tuple[str, int]:
    """One problem's text and answer: a start amount, then `steps` operations (0: one
    addition or subtraction of small numbers)."""
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    easy = steps == 0
    value = rng.randint(3, 20) if easy else rng.randint(5, 60)
    sentences = [f"{name} has {value} {item}."]
    for _ in range(max(steps, 1)):
        op, k = _pick_small_operation(rng, value) if easy else _pick_operation(rng, value)
        value = {"add": value + k, "sub": value - k, "mul": value * k, "div": value // k}[op]
        pronoun = PRONOUNS[name]
        sentences.append(rng.choice(TEMPLATES[op]).format(
            P=pronoun, p=pronoun.lower(), o="her" if pronoun == "She" else "him",
            k=k, item=item, friend=friend))
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), value


def _pick_small_operation(rng: random.Random, value: int) -> tuple[str, int]:
    """Add or subtract k in 2..10 (the result stays >= 1)."""
    if rng.random() < 0.5:
        return "add", rng.randint(2, 10)
    return "sub", rng.randint(2, min(10, value - 1))


def _pick_operation(rng: random.Random, value: int) -> tuple[str, int]:
    """An operation valid for `value` and its number k >= 2 (plural nouns read right);
    results stay whole, >= 1 and <= MAX_VALUE."""
    choices = ["add"] if value + 2 <= MAX_VALUE else []
    if value >= 3:
        choices.append("sub")
    if value * 2 <= MAX_VALUE:
        choices.append("mul")
    divisors = [d for d in range(2, 11) if value % d == 0]
    if divisors:
        choices.append("div")
    op = rng.choice(choices)
    if op == "add":
        return op, rng.randint(2, min(40, MAX_VALUE - value))
    if op == "sub":
        return op, rng.randint(2, min(value - 1, 40))
    if op == "mul":
        return op, rng.randint(2, min(5, MAX_VALUE // value))
    return op, rng.choice(divisors)


# ------------------------------------------------------------------ redaction
QUOTE_MARK = "[...]"


def redact_quotes(text: str, question: str, min_chars: int = 24) -> str:
    """`text` with every span of `min_chars` or more characters copied from `question`
    replaced by "[...]".

    Models often restate the problem before solving it. Run logs that are shared (the
    course's data/runs) keep the model's own words and name the problem by id, so a
    verbatim restatement of a GSM8K question is cut out of the logged completion.
    """
    from difflib import SequenceMatcher

    if not text or not question:
        return text
    for _ in range(50):  # each pass cuts one quote; a completion seldom holds more than a few
        m = SequenceMatcher(None, text, question, autojunk=False)
        block = m.find_longest_match(0, len(text), 0, len(question))
        if block.size < min_chars:
            return text
        text = text[: block.a] + QUOTE_MARK + text[block.a + block.size :]
    return text


def encode_prompt(s, problem) -> list[int]:
    """Token ids of the chat prompt for a problem in the run `s` (a labkit.session.Session:
    its tokenizer, config, policy and engine), cached by problem id, within the context (a
    longer one is refused or cut before any engine sees it: fit_prompt). Here, not in the
    session, so that the session and the held-out evaluation both take it from below."""
    from labkit.models import context_length  # torch, only once a run encodes

    ids = s.prompt_cache.get(problem.id)
    if ids is None:
        ids = prompt_token_ids(s.tokenizer, problem.question, s.cfg.prompt_examples)
        ids = s.prompt_cache[problem.id] = fit_prompt(
            s.tokenizer, problem, ids, context_length(s.policy, s.engine),
            s.cfg.rollout_max_response_len, truncate=s.cfg.long_prompts == "truncate",
            examples=s.cfg.prompt_examples)
    return ids
