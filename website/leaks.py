"""What must never appear on the site, and a reader of everything the site serves.

:func:`forbidden` collects the lines (20 characters or more, whitespace-normalised, terminal
escape codes removed) of every solution region, written answer and hidden test in
``solutions/`` and of every ``grader/`` module (each lesson's judges and example answers
included: :mod:`grader.lessons`), less the lines that the students get anyway (``lessons/``,
``course/``).
:func:`site_lines` reads every file under a built site, archives unpacked, HTML as its text and
JSON strings decoded, and a forbidden line is found there as a line or inside a longer one (a
traceback's ``----> 7`` line quoting it), however the page encodes it. The builder uses both as
a last guard on each output it shows; the site's leak test runs them over the finished site.
"""

from __future__ import annotations

import functools
import html
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

MIN_LENGTH = 20
REGIONS = (
    ("### BEGIN SOLUTION", "### END SOLUTION"),
    ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"),
)


#: Terminal colour and cursor codes (IPython's tracebacks are full of them).
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def normalise(line: str) -> str:
    """A line without terminal escape codes, stripped, its runs of whitespace single spaces."""
    return " ".join(ANSI.sub("", line).split())


class Matcher:
    """Finds which of a set of lines (each :data:`MIN_LENGTH` characters or more, normalised)
    occur *anywhere* in a text, as a whole line or inside a longer one: a traceback's
    ``----> 7     x = secret()`` holds ``x = secret()``. Indexed by each line's first
    :data:`MIN_LENGTH` characters, so a text is read once, whatever the number of lines."""

    def __init__(self, lines: set[str]) -> None:
        self.by_start: dict[str, list[str]] = {}
        for line in lines:
            if len(line) >= MIN_LENGTH:
                self.by_start.setdefault(line[:MIN_LENGTH], []).append(line)

    def in_line(self, line: str) -> set[str]:
        """The lines held by ``line`` (already normalised)."""
        found: set[str] = set()
        for i in range(len(line) - MIN_LENGTH + 1):
            for candidate in self.by_start.get(line[i : i + MIN_LENGTH], ()):
                if line.startswith(candidate, i):
                    found.add(candidate)
        return found

    def in_text(self, text: str) -> set[str]:
        """The lines held by any line of ``text``."""
        found: set[str] = set()
        for line in text.splitlines():
            n = normalise(line)
            if len(n) >= MIN_LENGTH:
                found |= self.in_line(n)
        return found


def _lines(text: str) -> set[str]:
    return {n for n in map(normalise, text.splitlines()) if len(n) >= MIN_LENGTH}


def _cell_sources(path: Path) -> Iterator[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        yield "".join(src) if isinstance(src, list) else src


def region_lines(text: str) -> set[str]:
    """The lines inside solution regions and hidden-test regions of ``text``."""
    found: set[str] = set()
    for begin, end in REGIONS:
        for block in re.findall(rf"{re.escape(begin)}(.*?){re.escape(end)}", text, re.S):
            found |= _lines(block)
    return found


def _allowed_texts(root: Path) -> Iterator[str]:
    """The texts students get anyway: the release's notebooks and files (as the file reads and
    cell by cell), the course package, and what the student kit adds to them."""
    for path in sorted((root / "lessons").rglob("*")):
        if not path.is_file() or path.suffix not in (".ipynb", ".py", ".md", ".txt", ".json"):
            continue
        yield path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".ipynb":
            for src in _cell_sources(path):
                yield src
                yield src.replace("`", "")  # prose as the page reads: inline code unmarked
    for path in sorted((root / "course").rglob("*.py")):
        yield path.read_text(encoding="utf-8")
    # What the student kit writes beside them (grader/package.py): its README and launcher.
    from grader.package import HOSTED_DEPENDENCIES, LAB_PY, README, kit_pyproject

    yield from (README, LAB_PY, kit_pyproject(root), kit_pyproject(root, HOSTED_DEPENDENCIES))


def allowed(root: Path) -> set[str]:
    """The lines students get anyway (:func:`_allowed_texts`)."""
    lines: set[str] = set()
    for text in _allowed_texts(root):
        lines |= _lines(text)
    return lines


def answer_lines(path: Path) -> set[str]:
    """The lines of a solution notebook that are answers: its solution and hidden-test regions
    (code cells) and its written answers (markdown cells marked as nbgrader solutions, whose
    release holds a placeholder instead)."""
    lines: set[str] = set()
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        lines |= region_lines(src)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "markdown" and meta.get("solution"):
            lines |= _lines(src)
    return lines


def forbidden(root: Path) -> set[str]:
    """Lines of solutions (code and written answers), hidden tests, grader modules, judges and
    example answers, less those students get anyway (:func:`not_given`)."""
    lines: set[str] = set()
    for path in sorted((root / "solutions").rglob("*.ipynb")):
        lines |= answer_lines(path)
    for path in sorted((root / "grader").rglob("*.py")):
        lines |= _lines(path.read_text(encoding="utf-8"))
    return not_given(lines, root)


def not_given(lines: set[str], root: Path) -> set[str]:
    """``lines`` less those that students get anyway: a line of ``lessons/`` or ``course/``, or a
    piece of one (a solution's ``x = y.float()`` that a lesson's prose quotes in a sentence, a
    message that a visible test cell spells out in its code)."""
    lines = set(lines)
    matcher = Matcher(lines)
    for text in _allowed_texts(root):
        lines -= matcher.in_text(text)
    return lines


class _Text(HTMLParser):
    """An HTML page's text: tags dropped, entities decoded, script and style bodies kept."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        #: attribute values (titles, data attributes), one a line
        self.attributes: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("br", "p", "div", "tr", "li", "pre"):
            self.parts.append("\n")
        self.attributes += [value for _, value in attrs if value]


def _json_strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
        if value[:1] in "[{":
            try:
                yield from _json_strings(json.loads(value))
            except ValueError:
                pass
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _json_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _json_strings(v)


def _embedded_json(text: str) -> Iterator[str]:
    """Strings of JSON documents found in ``text`` (a whole file, or script blocks)."""
    candidates = [text]
    candidates += re.findall(r"<script[^>]*>(.*?)</script>", text, re.S)
    for blob in candidates:
        blob = blob.strip()
        if blob[:1] not in "[{":
            continue
        try:
            yield from _json_strings(json.loads(blob))
        except ValueError:
            continue


def text_views(name: str, data: bytes) -> Iterator[tuple[str, str]]:
    """``(name, text)`` for a file: its text, HTML's text, JSON strings, archives' members."""
    lower = name.lower()
    if lower.endswith((".whl", ".zip")):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for member in zf.namelist():
                yield from text_views(f"{name}!{member}", zf.read(member))
        return
    if lower.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    yield from text_views(f"{name}!{member.name}", tar.extractfile(member).read())
        return
    if b"\0" in data[:4096] and not lower.endswith((".js", ".json", ".html", ".ipynb")):
        return  # images, fonts
    text = data.decode("utf-8", errors="replace")
    yield name, text
    yield name, html.unescape(text)
    if lower.endswith((".html", ".htm", ".xml", ".svg")):
        parser = _Text()
        parser.feed(text)
        yield name, "".join(parser.parts)
        yield name, "\n".join(parser.attributes)
    for value in _embedded_json(text):
        yield name, value


def site_lines(site: Path) -> dict[str, set[str]]:
    """``{normalised line: files holding it}`` over every file under ``site``."""
    found: dict[str, set[str]] = {}
    for path in sorted(p for p in site.rglob("*") if p.is_file()):
        rel = path.relative_to(site).as_posix()
        for name, text in text_views(rel, path.read_bytes()):
            for line in text.splitlines():
                n = normalise(line)
                if len(n) >= MIN_LENGTH:
                    found.setdefault(n, set()).add(name)
    return found


@functools.lru_cache(maxsize=1)
def _torch_source() -> str:
    """The installed torch's Python source, one normalised line a line (read once)."""
    import torch

    lines = []
    for path in sorted(Path(torch.__file__).parent.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines += [n for n in map(normalise, text.splitlines()) if len(n) >= MIN_LENGTH]
    return "\n".join(lines)


def in_torch_source(lines: set[str]) -> set[str]:
    """Those of ``lines`` that the installed torch's own source holds (as a line or inside one).

    A traceback through torch quotes torch's lines, and a few solution lines are torch's too
    (lesson 02's loss scaler raises GradScaler's own errors): torch's source is public and
    installed with the course, so a line of it gives nothing away. Read only when a guard has
    found something (a clean page costs nothing)."""
    if not lines:
        return set()
    source = _torch_source()
    return {line for line in lines if line in source}


def find_leaks(site: Path, lines: set[str]) -> dict[str, set[str]]:
    """``{line: files}`` for each of ``lines`` found anywhere in ``site``: as a line of a file
    or inside one (:class:`Matcher`), unless torch's own source holds it
    (:func:`in_torch_source`)."""
    matcher = Matcher({normalise(line) for line in lines})
    found: dict[str, set[str]] = {}
    for shown, files in site_lines(site).items():
        for line in matcher.in_line(shown):
            found.setdefault(line, set()).update(files)
    for line in in_torch_source(set(found)):
        del found[line]
    return found
