"""MkDocs hook: the configuration page's reference is generated from the config models.

`configuration.md` holds the marker below; the build replaces it with
`cluster.docgen.render_reference()`, the field docstrings of the pydantic models, so the
page is always what the code accepts.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARKER = "<!-- generated: configuration reference -->"
ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from cluster.docgen import render_reference

    return markdown.replace(MARKER, render_reference())
