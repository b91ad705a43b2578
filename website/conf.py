"""Sphinx configuration of the course's site (used by :mod:`website.build`, which passes the
build's settings in ``COURSE_SITE_SETTINGS``: a JSON file with the repository, branch, site URL
and the folder of vendored JavaScript)."""

import json
import os
from pathlib import Path

_here = Path(__file__).resolve().parent
_settings = json.loads(Path(os.environ["COURSE_SITE_SETTINGS"]).read_text(encoding="utf-8"))

project = "Mixed precision training with PyTorch"
author = "The course's authors"
copyright = "the course's authors, MIT license"
html_title = project
html_favicon = str(_here / "static" / "favicon.svg")
extensions = ["myst_nb", "sphinx.ext.githubpages"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

# The notebooks arrive executed (the solution's outputs, answers taken out): never run them here.
nb_execution_mode = "off"
# Streams are merged by website.pages, one run at a time (a page may show a CPU and a GPU run).
nb_merge_streams = False
# The widget manager is served by the site itself (website/vendor.py), not by a CDN: its
# self-contained embed.js renders the core widgets from the state stored in the page.
nb_ipywidgets_js = {"widgets/embed.js": {}}
# MathJax from the site too (Sphinx would load it from a CDN).
mathjax_path = "mathjax/tex-chtml-full.js"

html_theme = "sphinx_book_theme"
html_baseurl = _settings["site_url"]
html_static_path = [str(_here / "static"), _settings["vendor_static"]]
html_css_files = ["course.css"]
html_js_files = [("course-widgets-mathjax.js", {"priority": 100})]
# The theme's light/dark switch starts from this (left empty, the theme logs a console error).
html_context = {"default_mode": "light"}
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": _settings["repository"],
    "repository_branch": _settings["branch"],
    "use_repository_button": True,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
