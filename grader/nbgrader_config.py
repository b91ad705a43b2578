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

# Lessons train small models on the CPU: give a cell time, but not forever.
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = True

# Feedback never shows hidden tests (they hold reference implementations): see grader/feedback.py.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.feedback.StripHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
