"""Ships the repository's ``csrc/`` and ``patches/`` inside the package as ``kvprefetch/data/``.

Both stay at the repository root, where kernel engineers look for them; a ``package_dir``
mapping makes them the data-only packages ``kvprefetch.data.csrc`` and
``kvprefetch.data.patches``, so the wheel, the sdist and an editable install all carry them
(every file, at any depth) with no copy step. pyproject.toml holds the rest of the metadata;
only the package list lives here, because pyproject's ``packages.find`` cannot add a mapped
directory outside ``src/``. ``sources.upstream.kit_root`` finds ``kvprefetch/data`` in an
installed package, and the checkout itself in a source or editable one."""

from setuptools import find_packages, setup

DATA = {"kvprefetch.data.csrc": "csrc", "kvprefetch.data.patches": "patches"}

setup(
    package_dir={"": "src", **DATA},
    packages=find_packages("src") + list(DATA),
    package_data={"kvprefetch": ["probe/*.py"], **{p: ["**/*"] for p in DATA}},
)
