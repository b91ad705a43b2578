"""The JavaScript the site serves itself: the widget manager and MathJax, from the npm registry.

A lesson page shows its widgets from their stored state with ``@jupyter-widgets/html-manager``
(its self-contained ``embed.js``: the core widgets bundled, no require.js) and typesets the
lessons' formulas with MathJax. Both would come from a CDN by default; the site serves its own
copies, so a page needs nothing but the site. Each package's tarball is downloaded once from the
npm registry, checked against the registry's published sha512, and its needed files are kept in a
git-ignored cache (``.cache/site-vendor/``); later builds are offline.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class NpmFiles:
    """Files of one pinned npm package that the site serves under ``_static/<dest>/``."""

    name: str
    version: str
    #: the registry's ``dist.integrity`` for this version's tarball
    integrity: str
    #: folder inside the package whose files are kept, and which of them (name prefixes)
    folder: str
    keep: tuple[str, ...]
    dest: str

    @property
    def tarball(self) -> str:
        base = self.name.rsplit("/", 1)[-1]
        return f"{REGISTRY}/{self.name}/-/{base}-{self.version}.tgz"


#: ipywidgets 8's state (schema 2.0, controls 2.0.0 / base 2.0.0 / output 1.0.0) renders with
#: html-manager 1.x; ``embed.js`` and the fonts its bundled CSS refers to.
HTML_MANAGER = NpmFiles(
    name="@jupyter-widgets/html-manager",
    version="1.0.15",
    integrity="sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
    folder="package/dist/",
    keep=("embed.js", "*.woff", "*.woff2", "*.ttf", "*.eot", "*.svg"),
    dest="widgets",
)
#: MathJax 3 with every TeX extension in one file (nothing loaded later) and its web fonts.
MATHJAX = NpmFiles(
    name="mathjax",
    version="3.2.2",
    integrity="sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    folder="package/es5/",
    keep=("tex-chtml-full.js", "output/chtml/fonts/woff-v2/*"),
    dest="mathjax",
)
PACKAGES = (HTML_MANAGER, MATHJAX)


class VendorError(RuntimeError):
    """A package the site serves could not be fetched or did not match its checksum."""


def _matches(rel: str, patterns: tuple[str, ...]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(rel, p) and ("/" in p or "/" not in rel) for p in patterns)


def _download(pkg: NpmFiles) -> bytes:
    try:
        with urllib.request.urlopen(pkg.tarball, timeout=120) as response:
            data = response.read()
    except OSError as exc:
        raise VendorError(
            f"could not download {pkg.name} {pkg.version} from {pkg.tarball} ({exc}).\n"
            "The site serves the widget manager and MathJax itself and fetches them once from "
            "the npm registry; connect this machine to registry.npmjs.org once (or copy a "
            "filled .cache/site-vendor/ from another checkout) and build again."
        ) from exc
    algorithm, _, expected = pkg.integrity.partition("-")
    found = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if found != expected:
        raise VendorError(
            f"{pkg.tarball}: checksum {algorithm}-{found} is not the registry's {pkg.integrity}"
        )
    return data


def ensure_vendor(cache: Path, packages: tuple[NpmFiles, ...] = PACKAGES) -> Path:
    """A folder holding every package's files under its ``dest`` (fetched if not cached).

    Raises :class:`VendorError`, with what to do, when a package cannot be fetched.
    """
    for pkg in packages:
        folder = cache / f"{pkg.dest}-{pkg.version}"
        stamp = folder / ".complete"
        if stamp.exists():
            continue
        print(f"site: fetching {pkg.name} {pkg.version} from the npm registry", flush=True)
        data = _download(pkg)
        tmp = folder.with_name(folder.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        count = 0
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                if not member.isfile() or not member.name.startswith(pkg.folder):
                    continue
                rel = member.name[len(pkg.folder) :]
                if ".." in Path(rel).parts or not _matches(rel, pkg.keep):
                    continue
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                count += 1
        if count == 0:
            raise VendorError(f"{pkg.tarball} holds none of {pkg.keep} under {pkg.folder}")
        (tmp / ".complete").write_text(f"{pkg.name} {pkg.version}\n")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    static = cache / "static"
    shutil.rmtree(static, ignore_errors=True)
    for pkg in packages:
        shutil.copytree(
            cache / f"{pkg.dest}-{pkg.version}", static / pkg.dest, ignore=_ignore_stamp
        )
    return static


def _ignore_stamp(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == ".complete"]
