"""What must never appear on the site, and a reader of everything the site serves.

:func:`forbidden` collects the lines (20 characters or more, whitespace-normalised) of every
solution region and hidden test in ``solutions/``, of every ``grader/`` module (its judges
included) and of every example answer in ``tests/variants/``, less the lines that the students
get anyway (``lessons/``, ``course/``). :func:`site_lines` reads every file under a built site,
archives unpacked, HTML as its text and JSON strings decoded, so a line is found however the page
encodes it. The builder uses both as a last guard on each output it shows; the site's leak test
runs them over the finished site.
"""

from __future__ import annotations

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


def normalise(line: str) -> str:
    """A line stripped and with its runs of whitespace made single spaces."""
    return " ".join(line.split())


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


def allowed(root: Path) -> set[str]:
    """The lines students get anyway: the release's notebooks and files, the course package,
    and what the student kit adds to them."""
    lines: set[str] = set()
    for path in sorted((root / "lessons").rglob("*")):
        if not path.is_file() or path.suffix not in (".ipynb", ".py", ".md", ".txt", ".json"):
            continue
        lines |= _lines(path.read_text(encoding="utf-8", errors="replace"))  # as the file reads
        if path.suffix == ".ipynb":
            for src in _cell_sources(path):
                lines |= _lines(src)
    for path in sorted((root / "course").rglob("*.py")):
        lines |= _lines(path.read_text(encoding="utf-8"))
    # What the student kit writes beside them (grader/package.py): its README and launcher.
    from grader.package import LAB_PY, README, kit_pyproject

    for text in (README, LAB_PY, kit_pyproject(root)):
        lines |= _lines(text)
    return lines


def forbidden(root: Path) -> set[str]:
    """Lines of solutions, hidden tests, grader modules, judges and example answers that are not
    in ``lessons/`` or ``course/``."""
    lines: set[str] = set()
    for path in sorted((root / "solutions").rglob("*.ipynb")):
        for src in _cell_sources(path):
            lines |= region_lines(src)
    for path in sorted((root / "grader").rglob("*.py")):
        lines |= _lines(path.read_text(encoding="utf-8"))
    for path in sorted((root / "tests" / "variants").rglob("*.py")):
        lines |= _lines(path.read_text(encoding="utf-8"))
    return lines - allowed(root)


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


def find_leaks(site: Path, lines: set[str]) -> dict[str, set[str]]:
    """``{line: files}`` for each of ``lines`` found anywhere in ``site``."""
    seen = site_lines(site)
    return {line: seen[line] for line in lines if line in seen}
