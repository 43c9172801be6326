"""The students' copies of the lessons: the solutions taken out, the answers' outputs cleared.

`labkit students notebooks/` writes them (notebooks/students/): each solution block (between
`### BEGIN SOLUTION` and `### END SOLUTION`) becomes `name = None` for the names it
assigns (or a NotImplementedError when it assigns none), and the outputs of the exercise
and check cells are cleared, since they would show the answer. `labkit students --check`
fails when the committed copies are not what the sources give, which keeps them in step
in CI. The checks themselves are in `labkit.course.exercises`.

A copy is where a student works, so it is never overwritten behind their back: each copy
carries a fingerprint of what labkit wrote (`metadata.labkit.fingerprint`), and a copy
whose content no longer matches it (solved, run or saved since) is kept unless `force`.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

from labkit.course.exercises import BEGIN, CHECK_RE, END

STUDENTS = "students"  # default folder of the students' copies, inside the sources' folder


def check_calls(text: str) -> list[tuple[str, str | None]]:
    """The (exercise id, answer variable or None) of each `exercises.check(...)` call in text."""
    return [(m["id"], m["answer"]) for m in CHECK_RE.finditer(text)]


def student_source(source: str, id: str, answer: str | None = None) -> str:
    """A code cell's source with each solution block replaced by its placeholder.

    The placeholder of a block is `answer = None  # Exercise <id>: your answer` when the
    block assigns `answer` (the name its check cell grades), else the same line for each
    name the block assigns at its top level, or `raise NotImplementedError(...)` when it
    assigns none. Raises ValueError for markers that do not pair up.
    """
    lines = source.split("\n")
    out, block, indent = [], None, ""
    for number, line in enumerate(lines, 1):
        mark = line.strip()
        if mark == BEGIN:
            if block is not None:
                raise ValueError(f"line {number}: {BEGIN} inside another solution block")
            block, indent = [], line[: len(line) - len(line.lstrip())]
        elif mark == END:
            if block is None:
                raise ValueError(f"line {number}: {END} without {BEGIN}")
            out += [indent + p for p in _placeholder(block, id, indent, answer)]
            block = None
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
    if block is not None:
        raise ValueError(f"{BEGIN} without {END}")
    return "\n".join(out)


def _placeholder(block: list[str], id: str, indent: str, answer: str | None) -> list[str]:
    text = "\n".join(b[len(indent):] if b.startswith(indent) else b.lstrip() for b in block)
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise ValueError(f"exercise {id}: the solution block is not valid Python ({e})") from None
    names: list[str] = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in names:
                    names.append(n.id)
    if not names:
        return [f'raise NotImplementedError("Exercise {id}: write your solution here")']
    if answer in names:
        names = [answer]
    return [f"{name} = None  # Exercise {id}: your answer" for name in names]


def student_notebook(nb: dict, *, source_name: str = "") -> dict:
    """The students' copy of a notebook (a dict as stored): solutions replaced, the outputs of
    exercise and check cells cleared, a first cell that says how to grade it. The rest is kept."""
    nb = json.loads(json.dumps(nb))  # a deep copy
    cells = nb["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        text = _text(cell)
        solution = any(line.strip() == BEGIN for line in text.split("\n"))
        if solution:
            id, answer = _following_check(cells, i) or ("?", None)
            try:
                cell["source"] = _lines(student_source(text, id, answer))
            except ValueError as e:
                raise ValueError(f"{source_name or 'notebook'} cell {i}: {e}") from None
        if solution or CHECK_RE.search(text):
            cell["outputs"], cell["execution_count"] = [], None
    name = source_name or "the source notebook"
    cells.insert(0, {
        "cell_type": "markdown", "id": "students-copy", "metadata": {},
        "source": _lines(
            f"**Student copy** of `{name}`, written by `labkit students`: the exercises are "
            f"yours to solve. Replace each `None` marked `# Exercise ...` with your answer "
            f"and run the check cell below it: it says `correct.`, or `not yet` with a hint. "
            f"Neither cell stops *Run All*: an answer that raises an error prints it in one "
            f"line, and the check cell says so. Only a syntax error stops Run All at its "
            f"cell (Python cannot run any of it); fix it, then *Run > Run Selected Cell and "
            f"All Below*.\n\n"
            f"Grade the whole notebook in a terminal, from the repository folder, with the "
            f"course's environment active:\n\n"
            f"    {grading_command(f'notebooks/{STUDENTS}/{name}')}\n\n"
            f"It runs every cell in a fresh kernel and fails while an exercise is not solved."),
    })
    nb.setdefault("metadata", {})["labkit"] = {"student_copy_of": name}
    nb["metadata"]["labkit"]["fingerprint"] = fingerprint(nb)
    return nb


def grading_command(path: str) -> str:
    """The command that grades the notebook at `path` (relative to the repository folder)."""
    return f"python -m pytest --nbval-lax --nbval-current-env {path}"


def fingerprint(nb: dict) -> str:
    """A hash of a notebook's content, its own fingerprint left out: any edit, run or save
    of the copy changes it (formatting of the file does not)."""
    nb = json.loads(json.dumps(nb))
    nb.get("metadata", {}).get("labkit", {}).pop("fingerprint", None)
    text = json.dumps(nb, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def as_written(text: str) -> bool:
    """True when a copy's text is still what `labkit students` wrote (its fingerprint matches)."""
    try:
        nb = json.loads(text)
        stored = nb["metadata"]["labkit"]["fingerprint"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return False
    return stored == fingerprint(nb)


def _following_check(cells: list[dict], i: int) -> tuple[str, str | None] | None:
    """(id, answer variable) of the first check call at or after cell i, or None."""
    for cell in cells[i:]:
        if cell["cell_type"] == "code":
            found = check_calls(_text(cell))
            if found:
                return found[0]
    return None


def _text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _lines(text: str) -> list[str]:
    """Source text as the list of lines Jupyter stores."""
    return text.splitlines(keepends=True)


def dumps(nb: dict) -> str:
    """A notebook as Jupyter writes it (indent 1, sorted keys, a final newline)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def student_texts(src_dir: Path) -> dict[str, str]:
    """{file name: students' copy as text} for every *.ipynb directly in src_dir."""
    out = {}
    for path in sorted(Path(src_dir).glob("*.ipynb")):
        nb = _read_notebook(path)
        try:
            out[path.name] = dumps(student_notebook(nb, source_name=path.name))
        except (KeyError, TypeError, AttributeError) as e:  # JSON, but not as Jupyter writes it
            raise ValueError(f"{path}: not a notebook as Jupyter writes it ({e.__class__.__name__}: "
                             f"{e}); fix it in Jupyter or restore it from version control; no "
                             f"student copy was written") from None
    return out


def _read_notebook(path: Path) -> dict:
    """A source notebook as a dict; ValueError naming the file (and the line and column of
    what is wrong in it) when it cannot be read as one. No copy is written before every
    source has been read."""
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e}); no student copy was "
                         f"written") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a notebook (byte {e.start} is not UTF-8 text); restore it "
                         f"from version control; no student copy was written") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a notebook, damaged at line {e.lineno}, column {e.colno} "
                         f"({e.msg}); repair it there or restore it from version control; no "
                         f"student copy was written") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{path}: not a notebook (no list of cells in it); restore it from "
                         f"version control; no student copy was written")
    return nb


def write_students(src_dir: Path, out_dir: Path | None = None, *,
                   force: bool = False) -> tuple[list[Path], list[Path]]:
    """Write the students' copies of src_dir's notebooks into out_dir (default src_dir/students).

    A copy that differs from the fresh one and is no longer what labkit wrote (a student
    solved, ran or saved it) is kept, unless `force`. Returns (paths written, paths kept).
    """
    out_dir = Path(out_dir) if out_dir else Path(src_dir) / STUDENTS
    out_dir.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for name, text in student_texts(Path(src_dir)).items():
        path = out_dir / name
        if path.exists() and not force:
            old = path.read_text(encoding="utf-8")
            if old != text and not as_written(old):
                kept.append(path)
                continue
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written, kept


def stale_students(src_dir: Path, out_dir: Path | None = None) -> list[str]:
    """What differs between the copies in out_dir and what src_dir's notebooks give: one line
    per missing, stale (labkit wrote it from an older source), edited (solved, run or saved
    since labkit wrote it) or extra file (empty when they match)."""
    out_dir = Path(out_dir) if out_dir else Path(src_dir) / STUDENTS
    wanted = student_texts(Path(src_dir))
    problems = []
    for name, text in wanted.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        old = path.read_text(encoding="utf-8")
        if old == text:
            continue
        if as_written(old):
            problems.append(f"{path}: stale (its source {name} changed since labkit wrote it)")
        else:
            problems.append(f"{path}: edited since labkit wrote it (solved, run or saved: it may "
                            f"hold a student's answers); labkit students keeps it")
    for path in sorted(out_dir.glob("*.ipynb")) if out_dir.is_dir() else []:
        if path.name not in wanted:
            problems.append(f"{path}: extra (no source notebook {path.name})")
    return problems


EDITED = ": edited since labkit wrote it"  # in stale_students' line for a copy a student changed


def check_advice(src_dir, out_dir=None, problems: list[str] | None = None) -> str:
    """The last line of `labkit students --check` when copies are out of date: the command
    that rewrites them, and, when one was edited (`problems` from stale_students names it),
    a way that loses no answer: fresh copies written to a folder of their own, beside the
    edited ones, whose answers can then be copied across. Never --force, which overwrites
    the answers."""
    out = f" --out {out_dir}" if out_dir else ""
    line = f"the students' copies are out of date; run: labkit students {src_dir}{out}"
    if any(EDITED in p for p in problems or ()):
        fresh = Path(out_dir) if out_dir else Path(src_dir) / STUDENTS
        line += (f" (it keeps the edited copies and their answers; for fresh ones beside them: "
                 f"labkit students {src_dir} --out {fresh.parent / (fresh.name + '-fresh')})")
    return line

