"""The tuning log is frozen history (issue 45): it was labelled frozen and still grew by 400
lines. Its prose is held to the digest it was closed at; the report blocks inside it are left
out (they are regenerated from committed results by `kvprefetch report --readme`, which
test_readme_reports checks). A new measurement belongs in its run's folder under docs/results/
and, where it changes the design, in docs/design.md."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvprefetch.bench.readme_blocks import README_BLOCK

LOG = Path(__file__).resolve().parents[2] / "docs" / "tuning-log.md"
CLOSED_AT = "564d102f3ab7f30899f8f9d56baadbb4603d9a3e8b36da4571dbe14c341d545f"


def prose_digest(text: str) -> str:
    return hashlib.sha256(README_BLOCK.sub(r"\1\5", text).encode()).hexdigest()


def test_the_tuning_logs_prose_is_what_it_was_closed_at() -> None:
    assert prose_digest(LOG.read_text()) == CLOSED_AT, (
        "docs/tuning-log.md is frozen history: put the new measurement in its run's folder "
        "under docs/results/ and the design it changes in docs/design.md, not in the log")


def test_the_digest_leaves_out_only_the_generated_tables() -> None:
    text = LOG.read_text()
    block = README_BLOCK.search(text)
    assert block is not None
    regenerated = text.replace(block.group(4), "| a | regenerated | table |\n", 1)
    assert prose_digest(regenerated) == prose_digest(text)
    assert prose_digest(text.replace("Frozen history", "Living history", 1)) != \
        prose_digest(text)
