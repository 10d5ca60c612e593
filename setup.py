"""Ships the repository's ``csrc/`` and ``patches/`` inside the package as ``kvprefetch/data/``.

Both stay at the repository root, where kernel engineers look for them; a ``package_dir``
mapping makes them the data-only packages ``kvprefetch.data.csrc`` and
``kvprefetch.data.patches``, so the wheel, the sdist and an editable install all carry them
(every file, at any depth) with no copy step. pyproject.toml holds the rest of the metadata;
only the package list lives here, because pyproject's ``packages.find`` cannot add a mapped
directory outside ``src/``. ``sources.upstream.kit_root`` finds ``kvprefetch/data`` in an
installed package, and the checkout itself in a source or editable one."""

from pathlib import Path

from setuptools import find_packages, setup

DATA = {"kvprefetch.data.csrc": "csrc", "kvprefetch.data.patches": "patches"}


def importable_subdirs(package: str, root: str) -> list[str]:
    """The subdirectories of ``root`` whose path Python could import (``csrc/kvprefetch``, not
    ``patches/v0.10.2``), as dotted packages under ``package``. setuptools warns (about 40
    lines per install) for each such directory that holds data but is not listed in
    ``packages``; listing them is the fix it asks for. Their files still ship through the
    parent's ``**/*`` below."""
    found = []
    for path in sorted(Path(__file__).parent.joinpath(root).rglob("*")):
        parts = path.relative_to(Path(__file__).parent / root).parts
        if path.is_dir() and all(p.isidentifier() for p in parts):
            found.append(".".join((package, *parts)))
    return found


setup(
    package_dir={"": "src", **DATA},
    packages=find_packages("src") + list(DATA)
    + [sub for name, root in DATA.items() for sub in importable_subdirs(name, root)],
    package_data={"kvprefetch": ["probe/*.py"], **{p: ["**/*"] for p in DATA}},
)
