"""Lesson 04's grading: its judges (``judge``) and the wrong and valid answers it is audited with
(``variants``)."""
