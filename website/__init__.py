"""The course's static site: ``python3 run.py site`` (see :mod:`website.build`)."""
