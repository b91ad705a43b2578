"""Judges of converted hidden tests, one module per lesson (see :mod:`grader.judge`)."""
