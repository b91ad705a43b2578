"""Build the course's static site into ``_site/``: ``python3 run.py site [options]``.

    --executed DIR   executed solution notebooks to take the outputs from (the test suite's,
                     written with COURSE_TEST_ARTIFACTS=DIR: DIR/NN-x/NN-x.executed.ipynb);
                     without it every solution notebook is executed here, one at a time
    --results DIR    executed notebooks from a GPU (``scripts/gpu_check.py --save DIR``), shown
                     beside this run's outputs and labelled with the GPU and torch they ran on
    --out DIR        where the site goes (default _site/)
    --lessons ID...  only these lessons (a quicker build while writing one)
    --repository URL, --branch NAME, --site-url URL
                     override ``[tool.course]`` in pyproject.toml (also from the environment:
                     COURSE_REPOSITORY, COURSE_BRANCH, COURSE_SITE_URL)

Pages are Sphinx + myst-nb + sphinx-book-theme: myst-nb renders stored widget state and the
notebooks' outputs, Sphinx's own search runs in the browser without a server, and every file the
pages load is served by the site (:mod:`website.vendor`). The lesson pages are composed by
:mod:`website.pages`; :mod:`website.leaks` guards them against answers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import nbformat

from website import leaks, pages, vendor

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
CACHE = ROOT / ".cache"
STAMP = ".course-site"
LESSON_ID = re.compile(r"^\d\d-[a-z0-9-]+$")


class BuildError(RuntimeError):
    """The site cannot be built as asked (says what to do)."""


@dataclass
class Settings:
    """Where the course lives: its repository, the branch the buttons open, the site's URL."""

    repository: str
    branch: str
    site_url: str

    @property
    def owner_repo(self) -> str:
        path = urlparse(self.repository).path.strip("/")
        return path.removesuffix(".git")

    def colab(self, notebook: str) -> str:
        return (
            f"https://colab.research.google.com/github/{self.owner_repo}/blob/{self.branch}/"
            f"{notebook}"
        )

    def kaggle(self, notebook: str) -> str:
        return (
            "https://kaggle.com/kernels/welcome?src=https://github.com/"
            f"{self.owner_repo}/blob/{self.branch}/{notebook}"
        )


def settings(root: Path = ROOT, **overrides: str | None) -> Settings:
    """``[tool.course]`` of pyproject.toml, then the environment, then ``overrides``."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    course = data.get("tool", {}).get("course", {})
    env = {
        "repository": os.environ.get("COURSE_REPOSITORY"),
        "branch": os.environ.get("COURSE_BRANCH"),
        "site_url": os.environ.get("COURSE_SITE_URL"),
    }
    values = {}
    for key in ("repository", "branch", "site_url"):
        value = overrides.get(key) or env[key] or course.get(key)
        if not value:
            raise BuildError(f"no {key}: set [tool.course] {key} in pyproject.toml")
        values[key] = value
    values["repository"] = values["repository"].rstrip("/")
    if not values["site_url"].endswith("/"):
        values["site_url"] += "/"
    return Settings(**values)


def lesson_ids(root: Path = ROOT) -> list[str]:
    """The released lessons (``lessons/NN-x/NN-x.ipynb``)."""
    return sorted(
        p.name
        for p in (root / "lessons").iterdir()
        if LESSON_ID.match(p.name) and (p / f"{p.name}.ipynb").is_file()
    )


def find_notebook(folder: Path, lesson: str) -> Path | None:
    """``lesson``'s executed notebook in ``folder``, in any of the layouts the tools write."""
    for candidate in (
        folder / lesson / f"{lesson}.executed.ipynb",  # the test suite (COURSE_TEST_ARTIFACTS)
        folder / f"{lesson}.executed.ipynb",
        folder / f"{lesson}.ipynb",  # scripts/gpu_check.py --save
        folder / lesson / f"{lesson}.ipynb",
    ):
        if candidate.is_file():
            return candidate
    return None


def execute_solutions(lessons: list[str], dest: Path) -> Path:
    """Execute each lesson's solution notebook (one at a time, as the suite does) into ``dest``."""
    from grader.seam import LessonKernel

    for number, lesson in enumerate(lessons, 1):
        print(f"site: executing {lesson} ({number}/{len(lessons)})", flush=True)
        work = Path(tempfile.mkdtemp(prefix=f"site-{lesson}-"))
        try:
            shutil.copytree(ROOT / "solutions" / lesson, work, dirs_exist_ok=True)
            threads = {k: os.environ.get(k, "1") for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
            env = {**os.environ, **threads}
            with LessonKernel(work / f"{lesson}.ipynb", timeout=900, env=env) as kernel:
                out = dest / lesson / f"{lesson}.executed.ipynb"
                out.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(kernel.executed, out)
            print(f"site: {lesson} executed in {kernel.seconds:.0f} s", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return dest


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _readme_section(readme: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    if not match:
        raise BuildError(f"README.md has no '## {heading}' section")
    return match.group(1)


def _table(section: str) -> list[str]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    if len(rows) < 3:
        raise BuildError("README.md: a section's table is missing")
    return rows


#: How the outputs came to be, as the pages say it: with ``--executed`` the build runs nothing.
COMPUTED = {
    False: "by running the lesson's solution when this site was built",
    True: (
        "by a run of the lesson's solution before this site was built (the executed notebooks "
        "the build was given, such as the test suite's)"
    ),
}


def landing(
    root: Path,
    cfg: Settings,
    lessons: list[str],
    measured: dict[str, str],
    gpu: dict[str, str] | None = None,
    given: bool = False,
) -> str:
    """The landing page (MyST): the template with the README's lesson and device tables, how
    the outputs were computed (``given``: from executed notebooks the build was given) and which
    pages also show a GPU run (``gpu``: ``{lesson: the GPU and torch}``)."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    rows = _table(_readme_section(readme, "The lessons"))[2:]
    what = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        what[cells[0].strip("`")] = cells[1]
    places = set(measured.values())
    one = len(places) == 1 and len(measured) == len(lessons)
    items = []
    for lesson in lessons:
        where = measured.get(lesson)
        note = f" (outputs measured on {where})" if where and not one else ""
        items.append(f"- [{lesson}](lessons/{lesson}.ipynb): {what.get(lesson, '')}{note}")
    if one:
        items.append(f"\nThe outputs on these pages were measured on {places.pop()}.")
    by_gpu: dict[str, list[str]] = {}
    for lesson, label in (gpu or {}).items():
        by_gpu.setdefault(label, []).append(f"[{lesson}](lessons/{lesson}.ipynb)")
    for label, pages_of in by_gpu.items():
        show = "this page shows" if len(pages_of) == 1 else "these pages show"
        items.append(
            f"\nBeside those outputs, {show} the outputs of a run on **{label}**: "
            f"{', '.join(pages_of)}."
        )
    devices = "\n".join(_table(_readme_section(readme, "Devices")))
    text = (HERE / "templates" / "index.md").read_text(encoding="utf-8")
    text = text.replace("@@LESSONS@@", "\n".join(items))
    text = text.replace("@@COMPUTED@@", COMPUTED[given])
    text = text.replace("@@TOCTREE@@", "\n".join(f"lessons/{lesson}" for lesson in lessons))
    text = text.replace("@@DEVICES@@", devices)
    for key, value in {
        "REPOSITORY": cfg.repository,
        "BRANCH": cfg.branch,
        "SITE_URL": cfg.site_url,
        "NAME": cfg.owner_repo.rsplit("/", 1)[-1],
    }.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def header(
    cfg: Settings, lesson: str, page: pages.Page, gpu_labels: list[str], given: bool = False
) -> str:
    """The HTML block under a lesson's title: launch buttons, download, where it was measured
    and how (``given``: from executed notebooks the build was given, not run by it)."""
    notebook = f"lessons/{lesson}/{lesson}.ipynb"
    if page.measured_on:
        where = f"on <strong>{page.measured_on}</strong>"
    elif page.missing_outputs:
        where = "nowhere: this build had no executed notebook for it, so the page has no outputs"
    else:
        where = "on a device this run did not record"
    gpu = "".join(
        f" Beside them: the outputs of a run on <strong>{g}</strong>." for g in gpu_labels
    )
    return (
        '<div class="course-launch">\n'
        f'<a class="course-colab" href="{cfg.colab(notebook)}">Open in Colab</a>\n'
        f'<a class="course-kaggle" href="{cfg.kaggle(notebook)}">Open in Kaggle</a>\n'
        f'<a class="course-download" href="../notebooks/{lesson}.ipynb" '
        f'download="{lesson}.ipynb">Download the notebook</a>\n'
        "</div>\n"
        f'<p class="course-measured">The outputs on this page were computed {where}, '
        f"{COMPUTED[given]}.{gpu} Outputs that would show an "
        "exercise's answer are left out: run the notebook to see them.</p>\n"
    )


def insert_header(nb: nbformat.NotebookNode, block: str) -> None:
    """Put ``block`` right under the notebook's title (its first ``# `` line)."""
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(block))
        return
    title, _, rest = first.source.partition("\n")
    first.source = title
    nb.cells[1:1] = [nbformat.v4.new_markdown_cell(block)] + (
        [nbformat.v4.new_markdown_cell(rest.strip("\n"))] if rest.strip() else []
    )


@dataclass
class Built:
    """What a build made and what it cost."""

    out: Path
    seconds: float
    bytes: int
    lessons: dict[str, pages.Page] = field(default_factory=dict)
    wheel: Path | None = None


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / STAMP).exists():
        raise BuildError(f"{out} exists and is not a site built here: choose another --out")
    shutil.rmtree(out, ignore_errors=True)


def build(
    out: Path,
    executed: Path | None = None,
    results: Path | None = None,
    cfg: Settings | None = None,
    root: Path = ROOT,
    lessons: list[str] | None = None,
) -> Built:
    """Build the site into ``out``; returns the build's time and size (see the module's doc)."""
    started = time.perf_counter()
    cfg = cfg or settings(root)
    lessons = lessons or lesson_ids(root)
    static = vendor.ensure_vendor(CACHE / "site-vendor")
    given = executed is not None
    if executed is None:
        executed = execute_solutions(lessons, CACHE / "site-executed")
    forbidden = leaks.Matcher(leaks.forbidden(root))
    gpu_runs: dict[str, pages.Results] = {}
    if results is not None:
        if not results.is_dir():
            raise BuildError(f"--results {results}: no such folder")
        for lesson in lessons:
            path = find_notebook(results, lesson)
            if path is not None:
                nb = _read(path)
                gpu_runs[lesson] = pages.Results(
                    pages.setup_line(nb) or f"another run ({path.name}, device not recorded)", nb
                )
        if not gpu_runs:
            raise BuildError(f"--results {results}: no lesson's notebook (NN-x.ipynb) in it")
    missing = [lesson for lesson in lessons if find_notebook(executed, lesson) is None]
    if missing:
        print(
            f"site: no executed notebook in {executed} for {', '.join(missing)}: "
            "those pages have no outputs",
            flush=True,
        )
    _prepare_out(out)
    built = Built(out=out, seconds=0.0, bytes=0)
    with tempfile.TemporaryDirectory(prefix="course-site-") as tmp:
        src = Path(tmp) / "src"
        (src / "lessons").mkdir(parents=True)
        for lesson in lessons:
            release = _read(root / "lessons" / lesson / f"{lesson}.ipynb")
            path = find_notebook(executed, lesson)
            ran = _read(path) if path else None
            runs = [gpu_runs[lesson]] if lesson in gpu_runs else []
            try:
                page = pages.compose(release, ran, forbidden, runs)
            except pages.RepeatError as exc:
                raise BuildError(f"lessons/{lesson}: {exc}") from None
            labels = [r.label for r in runs]
            insert_header(page.notebook, header(cfg, lesson, page, labels, given))
            nbformat.write(page.notebook, src / "lessons" / f"{lesson}.ipynb")
            built.lessons[lesson] = page
        measured = {k: p.measured_on for k, p in built.lessons.items() if p.measured_on}
        gpu = {k: r.label for k, r in gpu_runs.items()}
        index = landing(root, cfg, lessons, measured, gpu, given)
        (src / "index.md").write_text(index, encoding="utf-8")
        conf = Path(tmp) / "settings.json"
        conf.write_text(
            json.dumps({**cfg.__dict__, "vendor_static": str(static)}), encoding="utf-8"
        )
        env = {**os.environ, "COURSE_SITE_SETTINGS": str(conf), "PYTHONWARNINGS": "ignore"}
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(HERE)]
        # Into the temporary folder first: myst-nb writes its jupyter_execute/ beside the output.
        html = Path(tmp) / "html"
        result = subprocess.run([*cmd, str(src), str(html)], env=env, cwd=tmp)
        if result.returncode != 0:
            raise BuildError(f"sphinx-build failed (exit code {result.returncode})")
        shutil.rmtree(html / ".doctrees", ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(html, out)
    (out / "notebooks").mkdir(exist_ok=True)
    for lesson in lessons:
        shutil.copy2(root / "lessons" / lesson / f"{lesson}.ipynb", out / "notebooks")
    from grader.package import write_course_index

    built.wheel = write_course_index(out / "pkg")
    (out / ".nojekyll").touch()
    (out / STAMP).write_text("built by python3 run.py site\n")
    built.seconds = time.perf_counter() - started
    built.bytes = tree_bytes(out)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="run.py site", description="Build the course's static site."
    )
    parser.add_argument("--executed", type=Path, metavar="DIR")
    parser.add_argument("--results", type=Path, metavar="DIR")
    parser.add_argument("--out", type=Path, default=ROOT / "_site", metavar="DIR")
    parser.add_argument("--repository")
    parser.add_argument("--branch")
    parser.add_argument("--site-url")
    parser.add_argument(
        "--lessons", nargs="+", metavar="ID", help="only these lessons (default: all)"
    )
    args = parser.parse_args(argv)
    try:
        cfg = settings(ROOT, repository=args.repository, branch=args.branch, site_url=args.site_url)
        if args.executed is not None and not args.executed.is_dir():
            raise BuildError(f"--executed {args.executed}: no such folder")
        unknown = sorted(set(args.lessons or []) - set(lesson_ids(ROOT)))
        if unknown:
            raise BuildError(f"no released lesson {', '.join(unknown)}")
        built = build(args.out.resolve(), args.executed, args.results, cfg, lessons=args.lessons)
    except (BuildError, vendor.VendorError) as exc:
        print(f"site: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"site: built {built.out} in {built.seconds:.1f} s, {built.bytes / 2**20:.1f} MiB "
        f"({len(built.lessons)} lessons); open {built.out / 'index.html'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
