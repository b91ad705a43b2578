"""False-failure audit: does a correct solution ever lose a point on some hidden-test seed?

``python -m grader.audit LESSON [--seeds N] [--exercise ID] [--variants]`` executes the lesson's
source notebook (``solutions/``, hidden tests included) once in one kernel
(:class:`grader.seam.LessonKernel`), then, for every exercise, re-runs its solution cell and its
test cell ``N`` times (default 200), each time with a fresh random grading key, so each run's
hidden tests draw new inputs from ``course.checks.hidden_seed``. With ``--variants`` it does the
same for every valid alternative in ``tests/variants/lNN_*.py`` (``VALID``). Every run that does
not earn the test cell's full points is a false failure; the report gives its seed, the key and
student that reproduce it, and the message. Exit status 1 when any was found.

Zero failures in ``N`` runs only bounds the failure rate (below about ``3/N`` with 95%
confidence); hidden tests are exact only when their references reproduce the computation they
check. This is not a timed test: a full audit takes minutes per lesson (the report says how long).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader import REPO_ROOT
from grader.keys import seed_for
from grader.seam import LessonKernel


@dataclass
class Failure:
    """One run that lost points: enough to reproduce it and see why."""

    variant: str  # "solution" or the valid variant's name
    seed: int
    key: str
    student: str
    score: float
    max_score: float
    message: str


@dataclass
class ExerciseAudit:
    """What the audit found for one exercise (the solution and its valid variants)."""

    exercise: str
    runs: dict[str, int] = field(default_factory=dict)  # variant -> runs
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_runs(self) -> int:
        """Runs over the solution and every variant."""
        return sum(self.runs.values())


def valid_variants(lesson: str, root: Path = REPO_ROOT) -> dict[str, tuple[str, str]]:
    """``{name: (grade_id, source)}``: the valid alternatives for ``lesson`` in ``tests/variants/``.

    The files are loaded by path (they are not part of the installed package); a lesson without a
    variants file, or a file without ``VALID``, has none.
    """
    found: dict[str, tuple[str, str]] = {}
    for path in sorted((root / "tests" / "variants").glob("l[0-9][0-9]_*.py")):
        spec = importlib.util.spec_from_file_location(f"_audit_variants_{path.stem}", path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if getattr(module, "LESSON", None) == lesson:
            found.update(getattr(module, "VALID", {}))
    return found


def fresh_keys() -> Iterator[str]:
    """An endless supply of random grading keys (one per audited run)."""
    while True:
        yield secrets.token_hex(16)


def audit_kernel(
    kernel: LessonKernel,
    seeds: int,
    exercises: Iterable[str] | None = None,
    valid: dict[str, tuple[str, str]] | None = None,
    keys: Iterator[str] | None = None,
    progress: Callable[[str], None] | None = None,
    solution: bool = True,
) -> list[ExerciseAudit]:
    """Audit the exercises of an executed lesson ``kernel``; see the module docstring.

    ``exercises`` defaults to every exercise of the notebook; ``valid`` are the variants to run
    besides the solution (``solution=False``: instead of it), each ``seeds`` times; ``keys``
    supplies the grading keys (random by default; the tests pass fixed ones).
    """
    keys = keys or fresh_keys()
    chosen = list(exercises) if exercises is not None else kernel.exercises()
    unknown = set(chosen) - set(kernel.exercises())
    if unknown:
        raise SystemExit(f"no such exercise in {kernel.path.name}: {', '.join(sorted(unknown))}")
    results = []
    for exercise in chosen:
        audit = ExerciseAudit(exercise)
        start = time.perf_counter()
        versions: list[tuple[str, str | None]] = [("solution", None)] if solution else []
        versions += [(n, src) for n, (gid, src) in sorted((valid or {}).items()) if gid == exercise]
        for name, source in versions:
            for i in range(seeds):
                key, student = next(keys), f"audit-{i}"
                run = kernel.run_exercise(exercise, source=source, key=key, student=student)
                audit.runs[name] = audit.runs.get(name, 0) + 1
                if not run.passed:
                    audit.failures.append(
                        Failure(
                            name,
                            seed_for(key, student, exercise),
                            key,
                            student,
                            run.score,
                            run.max_score,
                            run.error.strip()[-2000:],
                        )
                    )
            if progress:
                lost = sum(f.variant == name for f in audit.failures)
                progress(f"{exercise} [{name}]: {audit.runs.get(name, 0)} runs, {lost} lost points")
        audit.seconds = time.perf_counter() - start
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
        audits = audit_kernel(kernel, seeds, exercises, valid, keys, progress)
        return audits, kernel.seconds


def report(audits: list[ExerciseAudit], setup_seconds: float) -> str:
    """The audit as text: a line per exercise, then every failure with what reproduces it."""
    lines = [f"executed the lesson once in {setup_seconds:.1f} s", ""]
    lines.append(f"{'exercise':<24} {'runs':>6} {'lost':>5} {'seconds':>8}  versions")
    for a in audits:
        versions = ", ".join(f"{name} x{n}" for name, n in a.runs.items())
        lines.append(
            f"{a.exercise:<24} {a.total_runs:>6} {len(a.failures):>5} {a.seconds:>8.1f}  {versions}"
        )
    failures = [(a.exercise, f) for a in audits for f in a.failures]
    if failures:
        lines += [
            "",
            "runs that lost points (set course.checks._GRADING_KEY and _STUDENT_ID in a "
            "kernel to the key and student shown to replay one):",
        ]
        for exercise, f in failures:
            lines.append(
                f"- {exercise} [{f.variant}] seed {f.seed} (key {f.key}, student {f.student}): "
                f"{f.score:g}/{f.max_score:g}\n    " + f.message.replace("\n", "\n    ")
            )
    else:
        lines += ["", "no run lost a point"]
    return "\n".join(lines)


class _Replay:
    """One given key, reused for every run (``--key``)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __iter__(self) -> _Replay:
        return self

    def __next__(self) -> str:
        return self.key


def main(argv: list[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m grader.audit",
        description="Run each exercise's hidden tests against the solution (and valid "
        "variants) over many fresh seeds; report every run that lost points.",
    )
    parser.add_argument("lesson", help="lesson id, e.g. 02-loss-scaling")
    parser.add_argument("--seeds", type=int, default=200, help="runs per version (default 200)")
    parser.add_argument("--exercise", action="append", help="only this exercise (repeatable)")
    parser.add_argument("--variants", action="store_true", help="also the VALID variants")
    parser.add_argument(
        "--variant-seeds", type=int, help="runs per valid variant (default: --seeds)"
    )
    parser.add_argument("--key", help="replay: use this grading key (with --student) for every run")
    parser.add_argument("--student", default=None, help="replay: the student of --key")
    parser.add_argument("--json", type=Path, help="also write the findings as JSON here")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the course directory")
    args = parser.parse_args(argv)

    notebook = args.root / "solutions" / args.lesson / f"{args.lesson}.ipynb"
    if not notebook.is_file():
        parser.error(f"no solution notebook {notebook}")
    valid = valid_variants(args.lesson, args.root) if args.variants else {}
    keys = _Replay(args.key) if args.key else None

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    start = time.perf_counter()
    with LessonKernel(notebook, timeout=600) as kernel:
        say(f"{args.lesson}: executed once in {kernel.seconds:.1f} s")
        if args.key and args.student is not None:  # replay one (key, student) as reported
            for exercise in args.exercise or kernel.exercises():
                run = kernel.run_exercise(exercise, key=args.key, student=args.student)
                seed = seed_for(args.key, args.student, exercise)
                print(f"{exercise} seed {seed}: {run.score:g}/{run.max_score:g} {run.error}")
            return 0
        audits = audit_kernel(kernel, args.seeds, args.exercise, None, keys, say)
        if valid:
            chosen = args.exercise or kernel.exercises()
            n = args.variant_seeds if args.variant_seeds is not None else args.seeds
            extra = audit_kernel(kernel, n, chosen, valid, keys, say, solution=False)
            for a, b in zip(audits, extra, strict=True):
                a.runs.update(b.runs)
                a.failures += b.failures
                a.seconds += b.seconds
        setup = kernel.seconds
    print(report(audits, setup))
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    if args.json:
        args.json.write_text(
            json.dumps({"lesson": args.lesson, "audits": [asdict(a) for a in audits]}, indent=1)
        )
    return 1 if any(a.failures for a in audits) else 0


if __name__ == "__main__":
    raise SystemExit(main())
