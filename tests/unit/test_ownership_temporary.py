"""``ownership.temporary`` refuses with its caller's error family: a folder swapped for a link
while ``fetch`` ran ended it with exit 2 when the swap came before the temporary and exit 3 when
it came a moment later, in the copy (issue 41, the fifteenth hostile pass left it open). Real
folders and links in a temporary folder; nothing is mocked."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprefetch.errors import ConfigError, FetchError
from kvprefetch.workspace import ownership


def test_a_link_on_the_way_is_refused_as_the_callers_family(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "trees").symlink_to(elsewhere, target_is_directory=True)
    tmp = root / "trees" / ".patched.tmp-1"
    with pytest.raises(FetchError, match="is a symlink") as caught, \
            ownership.temporary(root, tmp, family=FetchError):
        pass
    assert caught.value.exit_code == FetchError.exit_code
    assert list(elsewhere.iterdir()) == []


def test_a_path_in_the_way_is_refused_as_the_callers_family_and_kept(tmp_path: Path) -> None:
    root = tmp_path / "work"
    (root / "trees").mkdir(parents=True)
    tmp = root / "trees" / ".patched.tmp-1"
    tmp.write_text("the user's\n")
    with pytest.raises(FetchError, match="in the way"), \
            ownership.temporary(root, tmp, family=FetchError):
        pass
    assert tmp.read_text() == "the user's\n"
    # without a family, the general configuration error, as before
    with pytest.raises(ConfigError, match="in the way") as caught, \
            ownership.temporary(root, tmp):
        pass
    assert type(caught.value) is ConfigError
