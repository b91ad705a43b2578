# nbgrader reads this file from the directory it runs in; the course's settings live in grader/.
c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file
load_subconfig("grader/nbgrader_config.py")  # noqa: F821
