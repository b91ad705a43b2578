# nbgrader settings for the course. The course directory is the repository root: instructors'
# notebooks (with solutions and hidden tests) live in solutions/, students' in lessons/.
c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "mixed-precision"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "lessons"
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    ".DS_Store",
]

# What students see where a solution was.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Lessons train small models on the CPU: give a cell time, but not forever. The limits are the
# grader's (grader/settings.py); set c.GraderSettings.cell_timeout above this line to change it.
from grader.settings import GraderSettings  # noqa: E402

c.Execute.timeout = GraderSettings(config=c).cell_timeout
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = True

# Feedback never shows hidden tests (they hold reference implementations): see grader/feedback.py.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.feedback.MarkUngraded",
    "grader.feedback.StripHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# Late work (see grader/late.py): the assignment's duedate and each student's extension live in
# the gradebook; the penalty is this nbgrader LateSubmissionPlugin. The course's policy: 10% of
# the score per day or part of a day late, at most 50%. Turn off the LMS's own late policy.
c.AssignLatePenalties.plugin_class = "grader.late.PenaltyPerDay"
c.PenaltyPerDay.per_day = 0.1
c.PenaltyPerDay.cap = 0.5
c.PenaltyPerDay.grace_minutes = 0

# nbgrader's exchange (JupyterHub courses): one root for nbgrader, formgrader and `intake
# --exchange` (this is nbgrader's own default).
c.Exchange.root = "/usr/local/share/nbgrader/exchange"

# The course's scoring rule: what a graded test cell writes to stderr (a warning, a log line)
# stays visible but never costs points; only an error fails a test (nbgrader's determine_grade
# would score any stderr 0). A step right after nbgrader's Execute in plain `nbgrader autograde`
# (`python -m grader autograde` applies it in its SandboxedExecute); Validate: jupyter/common.
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    Execute,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)

from course.selfcheck import WarningsAreNotFailures  # noqa: E402

c.Autograde.autograde_preprocessors = [
    Execute,
    WarningsAreNotFailures,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
