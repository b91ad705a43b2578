# nbgrader settings of both views of `python3 run.py lab` (and of the student kit and the class
# hub): the Validate button scores as the grader does. What a graded test cell writes to stderr
# (a warning, a log line) stays visible but is not a failure; only an error fails a test
# (nbgrader's own rule fails any stderr). See course.selfcheck.warnings_are_not_failures.
#
# nbgrader 0.9.6's Validator takes its steps from a list that is not a configurable option, and
# its Execute overrides nbclient's on_cell_executed hook, so the course's step is added to the
# list's default here: Validators made after this file is loaded (the Validate button's, the
# `nbgrader validate` command's) run it after Execute.
from nbgrader.validator import Validator

from course.selfcheck import WarningsAreNotFailures

_steps = Validator.class_traits()["preprocessors"]
(_default,) = _steps.default_args
if WarningsAreNotFailures not in _default:
    _steps.default_args = ([*_default, WarningsAreNotFailures],)
