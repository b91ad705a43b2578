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

Cells that *call* an exercise's function stay: their outputs are the lesson's experiments,
computed by the reference function on the lesson's data, which is what a learner sees once their
function is right (lesson 01's underflow explorer, lesson 09's benchmark and its MFU). The
exercises are graded on fresh random inputs, so these numbers answer nothing; the function's code
never appears.

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

from website.leaks import normalise

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


def hidden_cells(release: dict, solution: dict | None) -> dict[str, str]:
    """``{cell id: note}`` for the release's code cells whose outputs the page leaves out."""
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


def leaks_in(text: str, forbidden: set[str]) -> set[str]:
    """The lines of ``forbidden`` that ``text`` holds as lines (whitespace-normalised)."""
    return {n for n in (normalise(line) for line in text.splitlines()) if n in forbidden}


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


def compose(
    release: dict,
    executed: dict | None,
    forbidden: set[str],
    results: list[Results] = (),
) -> Page:
    """The page's notebook: the release's cells with the executed solution's outputs, answers
    left out, and each results run's outputs beside."""
    nb = nbformat.from_dict(copy.deepcopy(release))
    for cell in nb.cells:  # a notebook's file may hold a cell's source as a list of lines
        cell.source = _source(cell)
    hidden = hidden_cells(release, executed)
    by_id = {c.get("id"): c for c in (executed or {}).get("cells", [])}
    result_cells = [
        (r.label, {c.get("id"): c for c in r.notebook.get("cells", [])}) for r in results
    ]
    here = setup_line(executed) or "this run"
    shown: list[list[dict]] = []
    cells: list[NotebookNode] = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        cell.outputs = []
        ran = by_id.get(cell.get("id"))
        if ran is None:
            continue
        outputs = merge_streams(ran.get("outputs", []))
        note = hidden.get(cell.id)
        if note is None and leaks_in(output_text(outputs), forbidden):
            note = hidden[cell.id] = NOTE_CODE
        if note is not None:
            if outputs:
                cell.outputs = [_note(note)]
            continue
        extra = []
        for label, cells_of in result_cells:
            gpu = merge_streams(_gpu_outputs(cells_of.get(cell.id, {}).get("outputs", [])))
            if gpu and not leaks_in(output_text(gpu), forbidden):
                extra += [_label(label, "course-run-gpu"), *gpu]
        if extra and outputs:
            outputs = [_label(here, "course-run-cpu"), *outputs, *extra]
        elif extra:
            outputs = extra
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
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
