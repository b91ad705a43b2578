"""Unfair-grade audit: does a correct answer ever lose a point, or a wrong one earn one, on a seed?

``python -m grader.audit LESSON [--seeds N] [--time-cap S] [--exercise ID] [--variants]`` runs
the lesson's source notebook once in one kernel (:class:`grader.seam.LessonKernel`), then each
exercise's solution and test cell on up to ``N`` fresh grading keys; with ``--variants`` also
every valid and wrong variant of its grading package (:mod:`grader.lessons`) and each solution
made to warn and to log (:func:`make_noisy`). A run is unfair when a correct version loses a
point or a wrong one earns one; the report lists each with the key and student that replay it.
Exit status 1 when any was found. Zero unfair runs in ``N`` seeds bounds the rate below about
``3/N`` (95%).
"""

from __future__ import annotations

import argparse
import ast
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader import REPO_ROOT
from grader.keys import seed_for
from grader.lessons import lesson as find_lesson
from grader.seam import LessonKernel, SeamError

SOLUTION = "solution"
#: The kinds of version an exercise is audited with: the notebook's own solution, the valid
#: alternatives (``VALID``, must keep full points) and the wrong ones (``VARIANTS``, must earn 0).
KINDS = ("solution", "valid", "wrong")
RULE = (
    "unfair: a solution or valid run that loses any point; a wrong run whose test cell earns "
    "any point (score > 0)"
)


@dataclass
class Failure:
    """One unfair run: a correct version that lost points, or a wrong one that earned some."""

    variant: str  # "solution" or the variant's name
    seed: int
    key: str
    student: str
    score: float
    max_score: float
    message: str
    kind: str = SOLUTION  # one of KINDS


@dataclass
class ExerciseAudit:
    """What the audit found for one exercise (the solution and its variants)."""

    exercise: str
    runs: dict[str, int] = field(default_factory=dict)  # version -> runs
    kinds: dict[str, str] = field(default_factory=dict)  # version -> kind
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    seeds: int = 0  # seeds asked for (the most any version runs)
    seeds_done: int = 0  # seed rounds run
    capped: bool = False  # the time cap stopped it before ``seeds``
    time_cap: float | None = None
    errors: list[str] = field(default_factory=list)  # runs the seam itself could not grade

    @property
    def total_runs(self) -> int:
        """Runs over the solution and every variant."""
        return sum(self.runs.values())

    def runs_of(self, kind: str) -> int:
        """Runs of the versions of ``kind``."""
        return sum(n for name, n in self.runs.items() if self.kinds.get(name) == kind)

    def misses_of(self, kind: str) -> list[Failure]:
        """The unfair runs of the versions of ``kind``."""
        return [f for f in self.failures if f.kind == kind]

    @property
    def unfair(self) -> bool:
        """Any run graded unfairly, or one the seam could not grade."""
        return bool(self.failures or self.errors)


def declared_variants(lesson: str, kind: str) -> dict[str, tuple[str, str]]:
    """``{name: (grade_id, source)}``: the variants ``kind`` (``VARIANTS``: wrong, ``VALID``:
    valid) of the lesson's grading package, as written there ({} for a lesson without one)."""
    entry = find_lesson(lesson)
    return dict(getattr(entry.variants(), kind, {})) if entry else {}


def valid_variants(lesson: str, root: Path = REPO_ROOT) -> dict[str, tuple[str, str]]:
    """``{name: (grade_id, source)}``: the valid alternatives for ``lesson`` (``VALID``).

    With them, every exercise's solution made to warn and to log (:func:`noisy_variants`).
    """
    found = declared_variants(lesson, "VALID")
    notebook = root / "solutions" / lesson / f"{lesson}.ipynb"
    if notebook.is_file():
        found.update(noisy_variants(notebook))
    return found


#: What the generated noisy variants write to stderr (a test asserts the text reached the cell).
NOISE = {
    "warns": (
        "import warnings as _noisy_w\n"
        "with _noisy_w.catch_warnings():\n"
        "    _noisy_w.simplefilter('always')\n"
        "    _noisy_w.warn('a correct answer that warns', UserWarning, stacklevel=2)\n"
    ),
    "logs": (
        "import logging as _noisy_l\n"
        "_noisy_l.getLogger('student').warning('a correct answer that logs')\n"
    ),
}


def make_noisy(source: str, noise: str) -> str:
    """``source`` with ``NOISE[noise]`` run first in every function and method it defines: the
    same answer, which warns (or logs) whenever it is called, as torch's and NumPy's warnings and
    a student's own ``logging`` do. A correct answer that warns must keep its points."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            doc = int(
                bool(body)
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            )
            node.body = [*body[:doc], *ast.parse(NOISE[noise]).body, *body[doc:]]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def noisy_variants(
    notebook: Path, exercises: Iterable[str] | None = None
) -> dict[str, tuple[str, str]]:
    """``{"<exercise>__warns"|"<exercise>__logs": (exercise, source)}``: valid variants made from
    each exercise's solution cell (or those of ``exercises``) with :func:`make_noisy`. Exercises
    whose solution defines no function have none."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells}
    wanted = set(exercises) if exercises is not None else None
    found: dict[str, tuple[str, str]] = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id")
        if cell.cell_type != "code" or not meta.get("solution") or f"{gid}_tests" not in ids:
            continue
        if wanted is not None and gid not in wanted:
            continue
        if not any(
            isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(ast.parse(cell.source))
        ):
            continue
        for noise in NOISE:
            found[f"{gid}__{noise}"] = (gid, make_noisy(cell.source, noise))
    return found


def wrong_variants(lesson: str) -> dict[str, tuple[str, str]]:
    """``{name: (grade_id, source)}``: the wrong answers (``VARIANTS``) for ``lesson``.

    Each replaces the solution cell of exercise ``grade_id``, as ``tests/test_lessons.py`` runs
    them; every one must score zero on ``<grade_id>_tests``.
    """
    return declared_variants(lesson, "VARIANTS")


def fresh_keys() -> Iterator[str]:
    """An endless supply of random grading keys (one per audited seed)."""
    while True:
        yield secrets.token_hex(16)


def _unfair(kind: str, score: float, max_score: float) -> bool:
    """Whether a run of a version of ``kind`` was graded unfairly (see :data:`RULE`)."""
    return score > 0 if kind == "wrong" else score != max_score


def audit_kernel(
    kernel: LessonKernel,
    seeds: int,
    exercises: Iterable[str] | None = None,
    valid: dict[str, tuple[str, str]] | None = None,
    keys: Iterator[str] | None = None,
    progress: Callable[[str], None] | None = None,
    solution: bool = True,
    wrong: dict[str, tuple[str, str]] | None = None,
    time_cap: float | None = None,
    variant_seeds: int | None = None,
) -> list[ExerciseAudit]:
    """Audit the exercises of an executed lesson ``kernel``; see the module docstring.

    ``exercises`` defaults to every exercise of the notebook. For each, the solution (unless
    ``solution=False``), the ``valid`` and the ``wrong`` variants of that exercise run seed by
    seed: seed ``i`` is one grading key (``keys``, random by default; the tests pass fixed ones)
    and student ``audit-<i>``, shared by every version, so a wrong variant that scores can be
    set beside the solution on the same inputs. The solution runs on ``seeds`` seeds, variants on
    ``variant_seeds`` (default ``seeds``). ``time_cap`` (seconds per exercise) skips the rounds
    that would not fit, judged by the mean round so far; the first round always runs.
    """
    keys = keys or fresh_keys()
    n_variant = seeds if variant_seeds is None else variant_seeds
    chosen = list(exercises) if exercises is not None else kernel.exercises()
    unknown = set(chosen) - set(kernel.exercises())
    if unknown:
        raise SystemExit(f"no such exercise in {kernel.path.name}: {', '.join(sorted(unknown))}")
    results = []
    for exercise in chosen:
        versions: list[tuple[str, str, str | None]] = []
        if solution:
            versions.append((SOLUTION, SOLUTION, None))
        for kind, table in (("valid", valid), ("wrong", wrong)):
            mine = sorted((n, s) for n, (gid, s) in (table or {}).items() if gid == exercise)
            versions += [(n, kind, s) for n, s in mine]
        rounds = max([seeds if k == SOLUTION else n_variant for _, k, _ in versions], default=0)
        audit = ExerciseAudit(
            exercise, kinds={n: k for n, k, _ in versions}, seeds=rounds, time_cap=time_cap
        )
        found: list[tuple[int, int, Failure]] = []
        start = last_said = time.perf_counter()
        for i in range(rounds):
            elapsed = time.perf_counter() - start
            if time_cap and i and elapsed + elapsed / i > time_cap:
                audit.capped = True
                break
            key, student = next(keys), f"audit-{i}"
            seed = seed_for(key, student, exercise)
            for order, (name, kind, source) in enumerate(versions):
                if i >= (seeds if kind == SOLUTION else n_variant):
                    continue
                try:
                    run = kernel.run_exercise(exercise, source=source, key=key, student=student)
                except SeamError as exc:
                    audit.errors.append(f"{name} seed {seed} (key {key}, student {student}): {exc}")
                    break
                audit.runs[name] = audit.runs.get(name, 0) + 1
                if _unfair(kind, run.score, run.max_score):
                    message = run.error.strip()[-2000:] or "(no error: the test cell passed)"
                    failure = Failure(
                        name, seed, key, student, run.score, run.max_score, message, kind
                    )
                    found.append((order, i, failure))
            if audit.errors:
                break
            audit.seeds_done = i + 1
            if progress and time.perf_counter() - last_said > 30:
                last_said = time.perf_counter()
                progress(f"{exercise}: {i + 1}/{rounds} seeds, {len(found)} unfair runs so far")
        audit.failures = [f for _, _, f in sorted(found, key=lambda t: t[:2])]
        audit.seconds = time.perf_counter() - start
        if progress:
            progress(summary_line(audit))
        results.append(audit)
    return results


def audit_lesson(
    notebook: Path,
    seeds: int = 200,
    exercises: Iterable[str] | None = None,
    valid: dict[str, tuple[str, str]] | None = None,
    keys: Iterator[str] | None = None,
    progress: Callable[[str], None] | None = None,
    timeout: int = 600,
    wrong: dict[str, tuple[str, str]] | None = None,
    time_cap: float | None = None,
) -> tuple[list[ExerciseAudit], float]:
    """Execute ``notebook`` once and audit it; returns the audits and the first run's seconds."""
    with LessonKernel(Path(notebook), timeout=timeout) as kernel:
        broken = [
            gid
            for gid, (score, max_score, auto) in kernel.scores().items()
            if auto and score != max_score
        ]
        if broken and progress:
            progress(f"the first run of the notebook already lost points on {broken}")
        audits = audit_kernel(
            kernel, seeds, exercises, valid, keys, progress, wrong=wrong, time_cap=time_cap
        )
        return audits, kernel.seconds


def _seed_list(failures: list[Failure], limit: int = 6) -> str:
    seeds = [str(f.seed) for f in failures]
    return ", ".join(seeds[:limit]) + (f", ... ({len(seeds)} in all)" if len(seeds) > limit else "")


def summary_line(a: ExerciseAudit) -> str:
    """One exercise's counts: seeds run, time, then lost / scored runs by kind."""
    seeds = f"seeds {a.seeds_done}/{a.seeds}"
    if a.capped:
        seeds += f" (time cap {a.time_cap:g} s)"
    parts = [f"{a.exercise:<24} {seeds:<28} {a.seconds:>7.1f} s"]
    for kind, verb in (("solution", "lost"), ("valid", "lost"), ("wrong", "scored")):
        if not any(k == kind for k in a.kinds.values()):
            continue
        misses = a.misses_of(kind)
        text = f"{kind} {len(misses)}/{a.runs_of(kind)} {verb}"
        if misses and kind != SOLUTION:
            by_name: dict[str, list[Failure]] = {}
            for f in misses:
                by_name.setdefault(f.variant, []).append(f)
            text += " (" + "; ".join(f"{n} on seeds {_seed_list(fs)}" for n, fs in by_name.items())
            text += ")"
        parts.append(text)
    if a.errors:
        parts.append(f"{len(a.errors)} not graded (seam error)")
    return "  ".join(parts)


def report(audits: list[ExerciseAudit], setup_seconds: float, lesson: str = "LESSON") -> str:
    """The audit as text: a line per exercise, then every unfair run with what reproduces it."""
    lines = [f"executed the lesson once in {setup_seconds:.1f} s", RULE, ""]
    lines += [summary_line(a) for a in audits]
    for kind, title in (
        ("correct", "correct runs (solution, valid variants) that lost points"),
        ("wrong", "wrong variants' runs that scored (their exercise's test cell earned > 0)"),
    ):
        found = [
            (a.exercise, f)
            for a in audits
            for f in a.failures
            if (f.kind == "wrong") == (kind == "wrong")
        ]
        if not found:
            lines += ["", f"{title}: none"]
            continue
        lines += ["", f"{title}:"]
        for exercise, f in found:
            replay = (
                f"python -m grader.audit {lesson} --exercise {exercise}"
                + (f" --variant {f.variant}" if f.variant != SOLUTION else "")
                + f" --key {f.key} --student {f.student}"
            )
            lines.append(
                f"- {exercise} [{f.kind} {f.variant}] seed {f.seed}: {f.score:g}/{f.max_score:g}"
                f"\n    replay: {replay}\n    " + f.message.replace("\n", "\n    ")
            )
    errors = [(a.exercise, e) for a in audits for e in a.errors]
    if errors:
        lines += ["", "runs the seam could not grade (the exercise stopped there):"]
        lines += [f"- {exercise}: {e}" for exercise, e in errors]
    if not any(a.unfair for a in audits):
        lines += ["", "no run lost a point and no wrong run scored"]
    return "\n".join(lines)


class _Replay:
    """One given key, reused for every run (``--key``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __iter__(self) -> _Replay:
        return self

    def __next__(self) -> str:
        return self.key


def _git(root: Path, *args: str) -> str:
    """What ``git -C root ARGS`` prints ("" outside git or when it fails)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.rstrip() if out.returncode == 0 else ""


def checkout_state(root: Path, lesson: str) -> tuple[str | None, list[str]]:
    """The short commit of ``root``'s checkout and the lesson's files changed since it (its
    notebook folder, variants and judges): the audit grades the files as they are, not the
    commit."""
    commit = _git(root, "log", "-1", "--format=%h").strip() or None
    paths = [f"solutions/{lesson}"]
    if entry := find_lesson(lesson):
        paths.append(str(entry.folder.relative_to(REPO_ROOT)))
    changed = _git(root, "status", "--short", "--", *paths).splitlines()
    return commit, [line[3:] for line in changed]


def _replay(
    kernel: LessonKernel,
    exercises: list[str],
    tables: dict[str, tuple[str, str, str]],
    names: list[str] | None,
    key: str,
    student: str,
) -> int:
    """Run each chosen version once with ``key`` and ``student``; 1 when a run was unfair."""
    unfair = False
    for exercise in exercises:
        versions = [(SOLUTION, SOLUTION, None)] if not names or SOLUTION in names else []
        versions += [
            (n, kind, src)
            for n, (gid, kind, src) in sorted(tables.items())
            if gid == exercise and names and n in names
        ]
        for name, kind, source in versions:
            run = kernel.run_exercise(exercise, source=source, key=key, student=student)
            seed = seed_for(key, student, exercise)
            bad = _unfair(kind, run.score, run.max_score)
            unfair |= bad
            verdict = "UNFAIR" if bad else "fair"
            print(
                f"{exercise} [{kind} {name}] seed {seed}: {run.score:g}/{run.max_score:g} "
                f"{verdict} {run.error}"
            )
    return 1 if unfair else 0


def main(argv: list[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m grader.audit",
        description="Run each exercise's hidden tests against the solution (and the valid and "
        "wrong variants) over many fresh seeds; report every correct run that lost points and "
        "every wrong run that scored.",
    )
    parser.add_argument("lesson", help="lesson id, e.g. 02-loss-scaling")
    parser.add_argument("--seeds", type=int, help="most seeds per exercise (default 200)")
    parser.add_argument(
        "--time-cap",
        type=float,
        help="seconds per exercise before it stops early, saying how many seeds it ran "
        "(default 600; 0: no cap)",
    )
    parser.add_argument("--quick", action="store_true", help="3 seeds and a 60 s time cap")
    parser.add_argument("--exercise", action="append", help="only this exercise (repeatable)")
    parser.add_argument(
        "--variants", action="store_true", help="also the VALID and the wrong (VARIANTS) variants"
    )
    parser.add_argument(
        "--no-wrong", action="store_true", help="with --variants: the VALID ones only"
    )
    parser.add_argument(
        "--variant", action="append", help="only this variant (repeatable; 'solution' too)"
    )
    parser.add_argument("--variant-seeds", type=int, help="seeds per variant (default: --seeds)")
    parser.add_argument("--key", help="replay: use this grading key (with --student) for every run")
    parser.add_argument("--student", default=None, help="replay: the student of --key")
    parser.add_argument("--json", type=Path, help="also write the findings as JSON here")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the course directory")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 200)
    cap = args.time_cap if args.time_cap is not None else (60.0 if args.quick else 600.0)

    notebook = args.root / "solutions" / args.lesson / f"{args.lesson}.ipynb"
    if not notebook.is_file():
        parser.error(f"no solution notebook {notebook}")
    use_variants = args.variants or bool(args.variant)
    valid = valid_variants(args.lesson, args.root) if use_variants else {}
    wrong = wrong_variants(args.lesson) if use_variants and not args.no_wrong else {}
    if args.variant:
        known = {SOLUTION, *valid, *wrong}
        missing = sorted(set(args.variant) - known)
        if missing:
            parser.error(f"no such variant for {args.lesson}: {', '.join(missing)}")
        valid = {n: v for n, v in valid.items() if n in args.variant}
        wrong = {n: v for n, v in wrong.items() if n in args.variant}
    keys = _Replay(args.key) if args.key else None

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    commit, changed = checkout_state(args.root, args.lesson)
    if commit:
        say(f"commit {commit}" + (f", with uncommitted {', '.join(changed)}" if changed else ""))
    start = time.perf_counter()
    with LessonKernel(notebook, timeout=600) as kernel:
        say(f"{args.lesson}: executed once in {kernel.seconds:.1f} s")
        exercises = args.exercise or kernel.exercises()
        strays = sorted(
            f"{n} ({gid})"
            for n, (gid, _) in {**valid, **wrong}.items()
            if gid not in kernel.exercises()
        )
        if strays:
            say(f"variants naming no exercise of the notebook (not run): {', '.join(strays)}")
        if args.key and args.student is not None:  # replay one (key, student) as reported
            tables = {n: (gid, "valid", s) for n, (gid, s) in valid.items()}
            tables |= {n: (gid, "wrong", s) for n, (gid, s) in wrong.items()}
            return _replay(kernel, exercises, tables, args.variant, args.key, args.student)
        audits = audit_kernel(
            kernel,
            seeds,
            exercises,
            valid,
            keys,
            say,
            solution=not args.variant or SOLUTION in args.variant,
            wrong=wrong,
            time_cap=cap or None,
            variant_seeds=args.variant_seeds,
        )
        setup = kernel.seconds
    total = time.perf_counter() - start
    if commit:
        print(
            f"{args.lesson} at commit {commit}" + (" (with uncommitted changes)" if changed else "")
        )
    print(report(audits, setup, args.lesson))
    print(f"\ntotal {total:.1f} s")
    if args.json:
        record = {
            "lesson": args.lesson,
            "commit": commit,
            "uncommitted": changed,
            "rule": RULE,
            "seeds": seeds,
            "time_cap": cap or None,
            "setup_seconds": setup,
            "total_seconds": total,
            "strays": strays,
            "audits": [asdict(a) for a in audits],
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 1 if any(a.unfair for a in audits) else 0


if __name__ == "__main__":
    raise SystemExit(main())
