"""A lesson page's notebook: the student's cells, the outputs of the solution's run, no answer.

The page shows the release (``lessons/NN-x/NN-x.ipynb``) cell for cell. Each code cell gets the
outputs its twin (same cell ``id``, which nbgrader's release keeps) produced when the solution
notebook ran, except where those outputs would show an answer. A cell's outputs are left out,
with a note saying to run the notebook, when the cell

- is an exercise's solution cell or an autograded test cell (nbgrader's ``solution`` / ``grade``
  metadata, in the release or in the solution), since its outputs are the answer's or the
  hidden tests';
- names a *value* an exercise asks for: a name a solution cell binds by assignment (lesson 03's
  ``predict_cuda_dtypes`` dict) or any other non-function name a solution cell defines, since
  printing or tabulating it prints the answer itself;
- printed a line of exercise code, hidden tests or grader code (:func:`website.leaks.forbidden`),
  whatever the reason (a cell that writes a learner's function into a script and shows it).

Hiding is transitive: a name that such a cell binds (``t = dtype_table(predict_cuda_dtypes)``)
is treated as the value itself in later cells. And the build refuses (:class:`RepeatError`) a
page whose shown outputs repeat a line that a left-out cell printed, whatever the route.

Cells that *call* an exercise's function stay: their outputs are the lesson's experiments,
computed by the reference function on the lesson's data, which is what a learner sees once their
function is right (lesson 01's underflow explorer, lesson 09's benchmark and its MFU). Some
graded checks do run the function on the lesson's own data (lesson 01's judge compares
``underflow_fraction(grads, 1.0)`` on the lesson's gradients within a relative 2**-23), but what
the page shows are the experiments' rounded figures (the explorer's "underflow: 5.83%"), which
cannot meet such tolerances, and the function's code never appears.

Widgets are shown from the stored state of the models that the shown outputs display (and the
models those refer to); the state of any other widget is dropped.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import dataclass, field

import nbformat
from nbformat import NotebookNode

from website.leaks import MIN_LENGTH, Matcher, in_torch_source, normalise

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: What ``course.setup()`` prints first in every lesson: the device and torch of the run.
RUNNING_ON = re.compile(r"^Running on (?P<what>.+?); seed \d+\.\s*$", re.MULTILINE)
NOTE_ANSWER = (
    "Output not shown here: it would show the answer to an exercise. Run the notebook to see it."
)
NOTE_TEST = "Output not shown here: this cell checks your answer. Run the notebook to see it."
NOTE_CODE = "Output not shown here: it prints exercise code. Run the notebook to see it."
NOTE_WIDGET = (
    "This widget is shown as the run left it; its controls need a running Python kernel. To move "
    "them, open the lesson in Colab or Kaggle (buttons at the top of the page) or run it on your "
    "machine (`python3 run.py lab`)."
)


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def exercise_names(solution: dict) -> tuple[set[str], set[str]]:
    """``(functions, values)``: the top-level names the solution cells define (imports left out):
    functions and classes, and everything else (assigned values)."""
    functions: set[str] = set()
    values: set[str] = set()
    for cell in solution.get("cells", []):
        if cell.get("cell_type") != "code" or not _nbgrader(cell).get("solution"):
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                functions.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    values.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return functions, values - functions


def names_in(source: str, names: set[str]) -> set[str]:
    """Which of ``names`` appear in ``source`` as words (in code, strings or comments alike)."""
    return {n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}\b", source)}


def bound_names(source: str) -> set[str]:
    """The names a cell binds at its top level (assignments, loops, ``with ... as``, functions
    and classes; imports left out): what later cells can read of what it computed."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
    return names


def hidden_cells(release: dict, solution: dict | None) -> dict[str, str]:
    """``{cell id: note}`` for the release's code cells whose outputs the page leaves out.

    Hiding is transitive: a name that a cell left out for reading an exercise's value binds
    (``t = dtype_table(answer)``) holds what it computed from that value, so a later cell that
    reads it is left out too. Solution and test cells pass nothing on: what they bind is the
    learner's own (functions that later experiments call) or the tests' scratch names.
    """
    graded = {}
    for nb in (release, solution or {}):
        for cell in nb.get("cells", []):
            meta = _nbgrader(cell)
            if cell.get("cell_type") == "code" and (meta.get("solution") or meta.get("grade")):
                graded[cell.get("id")] = NOTE_ANSWER if meta.get("solution") else NOTE_TEST
    _, values = exercise_names(solution or release)
    found: dict[str, str] = {}
    for cell in release.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        cid = cell.get("id")
        if cid in graded:
            found[cid] = graded[cid]
        elif names_in(_source(cell), values):
            found[cid] = NOTE_ANSWER
            values |= bound_names(_source(cell))
    return found


def output_text(outputs: list[dict]) -> str:
    """Every piece of text in ``outputs``: streams, errors, text/HTML/JSON/markdown data."""
    parts: list[str] = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(_source({"source": out.get("text", "")}))
        elif kind == "error":
            parts += [out.get("ename", ""), out.get("evalue", ""), *out.get("traceback", [])]
        for mime, value in (out.get("data") or {}).items():
            if mime.startswith("image/") and not mime.endswith("svg+xml"):
                continue
            parts.append(value if isinstance(value, str) else json.dumps(value))
            if isinstance(value, list):
                parts.append("".join(value))
    return "\n".join(parts)


def leaks_in(text: str, forbidden: set[str] | Matcher) -> set[str]:
    """The lines of ``forbidden`` that ``text`` holds, as lines or inside longer ones (a
    traceback's ``----> 7`` line), terminal escape codes and whitespace runs aside; not those
    that torch's own source holds (:func:`website.leaks.in_torch_source`)."""
    matcher = forbidden if isinstance(forbidden, Matcher) else Matcher(forbidden)
    found = matcher.in_text(text)
    return found - in_torch_source(found)


def setup_line(nb: dict | None) -> str | None:
    """What the notebook's ``course.setup()`` printed: device and torch (None if not found)."""
    for cell in (nb or {}).get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                match = RUNNING_ON.search(_source({"source": out.get("text", "")}))
                if match:
                    return match.group("what")
    return None


def _widget_ids(value: object) -> set[str]:
    text = json.dumps(value)
    return set(re.findall(r"IPY_MODEL_([0-9a-zA-Z_-]+)", text)) | set(
        re.findall(r'"model_id": "([0-9a-zA-Z_-]+)"', text)
    )


def widget_state(nb: dict, shown: list[list[dict]]) -> dict | None:
    """The notebook's stored widget state cut to the models ``shown`` outputs display (and the
    models those refer to); None when nothing shown is a widget."""
    state = (nb.get("metadata", {}).get("widgets") or {}).get(WIDGET_STATE, {})
    models = state.get("state", {})
    todo = set().union(*(_widget_ids(outputs) for outputs in shown)) if shown else set()
    keep: dict[str, dict] = {}
    while todo:
        model = todo.pop()
        if model in keep or model not in models:
            continue
        keep[model] = models[model]
        todo |= _widget_ids(models[model]) - set(keep)
    if not keep:
        return None
    return {**state, "state": keep}


@dataclass
class Results:
    """Another run's executed notebook (a GPU's, from ``scripts/gpu_check.py --save``)."""

    label: str
    notebook: dict


@dataclass
class Page:
    """A composed lesson notebook and what the page says about it."""

    notebook: NotebookNode
    measured_on: str | None
    hidden: dict[str, str] = field(default_factory=dict)
    missing_outputs: bool = False
    widgets: int = 0


def _label(text: str, css: str) -> dict:
    return nbformat.v4.new_output(
        "display_data",
        data={"text/html": f'<p class="course-run-label {css}">{text}</p>', "text/plain": text},
    )


def _note(text: str) -> dict:
    return nbformat.v4.new_output(
        "display_data",
        data={"text/html": f'<p class="course-note">{text}</p>', "text/plain": text},
    )


def merge_streams(outputs: list[dict]) -> list[dict]:
    """Adjacent stream outputs of the same name joined into one, as a notebook shows them (the
    page keeps one run's streams apart from another's, so it does not let myst-nb merge them)."""
    merged: list[dict] = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (
            last is not None
            and out.get("output_type") == "stream"
            and last.get("output_type") == "stream"
            and out.get("name") == last.get("name")
        ):
            last["text"] = _source({"source": last["text"]}) + _source({"source": out["text"]})
            continue
        merged.append(copy.deepcopy(out))
    return merged


def _gpu_outputs(outputs: list[dict]) -> list[dict]:
    """A results run's outputs without widget views (that run stored no widget state)."""
    kept = []
    for out in outputs:
        out = copy.deepcopy(out)
        data = out.get("data")
        if data and WIDGET_VIEW in data:
            data.pop(WIDGET_VIEW)
            if set(data) <= {"text/plain"}:
                continue
        kept.append(out)
    return kept


class RepeatError(ValueError):
    """A shown output repeats a line that a left-out cell printed (says which cells)."""


#: An object's repr (``<Figure size 800x340 with 1 Axes>``): the same whatever a cell computed.
REPR = re.compile(r"<[A-Za-z_][\w.]*(?: [^<>]*)?>")


def printed_lines(outputs: list[dict], devices: list[str] = ()) -> set[str]:
    """The lines of ``outputs`` that say something: normalised, with a letter or digit, and
    :data:`~website.leaks.MIN_LENGTH` characters or more once object reprs and the names of the
    ``devices`` the runs measured on (which every page states) are taken out."""
    found = set()
    for line in output_text(outputs).splitlines():
        n = normalise(line)
        rest = REPR.sub("", n)
        for device in devices:
            rest = rest.replace(device, "")
        rest = " ".join(rest.split())
        if len(rest) >= MIN_LENGTH and any(ch.isalnum() for ch in rest):
            found.add(n)
    return found


#: A markdown heading: its level and its text.
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def figure_alt(title: str, section: str, number: int | None) -> str:
    """A figure's alt text: which lesson, which section and which cell draw it (the plot's own
    title lives in its pixels)."""
    plain = [re.sub(r"[`*_]", "", t) for t in (title, section)]
    where = f", section “{plain[1]}”" if plain[1] and plain[1] != plain[0] else ""
    cell = f", cell {number}" if number else ""
    return f"Figure drawn by {plain[0] or 'this lesson'}{where}{cell}"


def compose(
    release: dict,
    executed: dict | None,
    forbidden: set[str] | Matcher,
    results: list[Results] = (),
) -> Page:
    """The page's notebook: the release's cells with the executed solution's outputs, answers
    left out, and each results run's outputs beside.

    Raises :class:`RepeatError` when an output it would show repeats a line that a left-out
    cell printed (of this run or a results run): the rules above missed a way the answer
    travels from one cell to another, and the page must not be built until they catch it.
    """
    matcher = forbidden if isinstance(forbidden, Matcher) else Matcher(forbidden)
    nb = nbformat.from_dict(copy.deepcopy(release))
    for cell in nb.cells:  # a notebook's file may hold a cell's source as a list of lines
        cell.source = _source(cell)
    hidden = hidden_cells(release, executed)
    by_id = {c.get("id"): c for c in (executed or {}).get("cells", [])}
    result_cells = [
        (r.label, {c.get("id"): c for c in r.notebook.get("cells", [])}) for r in results
    ]
    for cid, ran in by_id.items():
        if cid not in hidden and leaks_in(output_text(ran.get("outputs", [])), matcher):
            hidden[cid] = NOTE_CODE
    devices = [d for d in [setup_line(executed), *(setup_line(r.notebook) for r in results)] if d]
    left_out: dict[str, str] = {}  # line -> the left-out cell that printed it
    for cells_of in [by_id, *(c for _, c in result_cells)]:
        for cid in hidden:
            for line in printed_lines(cells_of.get(cid, {}).get("outputs", []), devices):
                left_out.setdefault(line, cid)
    number = {c.get("id"): i for i, c in enumerate(release.get("cells", []), 1)}

    def check(cid: str, outputs: list[dict], run: str) -> None:
        repeated = sorted(printed_lines(outputs, devices) & set(left_out))
        if repeated:
            line = repeated[0]
            raise RepeatError(
                f"cell {cid} (cell {number.get(cid)} of the release) would show, from {run}, "
                f"{line!r}, which the left-out cell {left_out[line]} (cell "
                f"{number.get(left_out[line])}) printed ({len(repeated)} such line(s)): leave "
                "it out too, or make the lesson print it differently"
            )

    here = setup_line(executed) or "this run"
    shown: list[list[dict]] = []
    cells: list[NotebookNode] = []
    title, section = "", ""
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                match = HEADING.match(line)
                if match:
                    title = title or match.group(2)
                    section = match.group(2)
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        cell.outputs = []
        ran = by_id.get(cell.get("id"))
        if ran is None:
            continue
        outputs = merge_streams(ran.get("outputs", []))
        note = hidden.get(cell.id)
        if note is not None:
            if outputs:
                cell.outputs = [_note(note)]
            continue
        check(cell.id, outputs, here)
        extra = []
        for label, cells_of in result_cells:
            gpu = merge_streams(_gpu_outputs(cells_of.get(cell.id, {}).get("outputs", [])))
            if gpu and not leaks_in(output_text(gpu), matcher):
                check(cell.id, gpu, label)
                extra += [_label(label, "course-run-gpu"), *gpu]
        if extra and outputs:
            outputs = [_label(here, "course-run-cpu"), *outputs, *extra]
        elif extra:
            outputs = extra
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
        if any(m.startswith("image/") for o in outputs for m in (o.get("data") or {})):
            alt = figure_alt(title, section, number.get(cell.id))
            cell.metadata.setdefault("mystnb", {})["image"] = {"alt": alt}
        if any(WIDGET_VIEW in (o.get("data") or {}) for o in outputs):
            shown.append(outputs)
            cells.append(nbformat.v4.new_markdown_cell(NOTE_WIDGET))
    nb.cells = cells
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    nb.metadata.pop("widgets", None)
    state = widget_state(executed or {}, shown) if executed else None
    if state is not None:
        nb.metadata["widgets"] = {WIDGET_STATE: state}
    return Page(
        notebook=nb,
        measured_on=setup_line(executed) if executed else None,
        hidden=hidden,
        missing_outputs=executed is None,
        widgets=len(shown),
    )
