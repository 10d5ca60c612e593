"""Reading a package index's *simple* page for one file: PEP 691 JSON, or the PEP 503 HTML
that mirrors serve. Pure text in, the file's URL and advertised sha256 out; fetching the page,
and what the kit then trusts, are ``download.py``'s."""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from dataclasses import dataclass
from html.parser import HTMLParser


@dataclass(frozen=True)
class IndexFile:
    url: str
    sha256: str | None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def parse_simple_json(body: str, filename: str, base: str) -> IndexFile | None:
    for f in json.loads(body).get("files", []):
        if f.get("filename") == filename:
            return IndexFile(urllib.parse.urljoin(base, f["url"]),
                             f.get("hashes", {}).get("sha256"))
    return None


# An <a> tag: what the parser is given, one tag at a time, and only a tag that names the file.
# Python's HTMLParser takes about 3 us a character of a page of `<` (each one a tag begun), so
# an index page of 64 MiB of them (the most the kit reads) kept fetch and the prepare job
# parsing for minutes (issue 41, the twenty-eighth hostile pass); the scan is linear (no tag
# holds `<`; a quoted value may hold `>`, as a mirror's unescaped data-requires-python=">=3.9"
# does, and is taken whole, possessively).
_ANCHOR = re.compile(r"""<a\s(?:[^<>"']|"[^"<]*"|'[^'<]*')*+>""", re.IGNORECASE)


def parse_simple_html(body: str, filename: str, base: str) -> IndexFile | None:
    for m in _ANCHOR.finditer(body):
        tag = m.group(0)
        if filename not in (html.unescape(tag) if "&" in tag else tag):
            continue
        p = _Links()
        p.feed(tag)
        for href in p.links:
            url, _, frag = href.partition("#")
            if url.rsplit("/", 1)[-1] == filename:
                sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else None
                return IndexFile(urllib.parse.urljoin(base, url), sha)
    return None
