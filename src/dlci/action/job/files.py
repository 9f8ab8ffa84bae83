"""Files around the job's steps: coverage paths made relative, the image's torch record.

Runs inside the container (``dlci run``); never imports torch (the record is read, not
imported: importing torch takes seconds).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_bytes, read_input


def relative_coverage(path: Path, root: Path) -> None:
    """Coverage XML with paths relative to the workspace (pytest-cov #329): Codecov needs them."""
    if not path.is_file():
        return
    import xml.etree.ElementTree as ET

    try:
        tree = ET.parse(path)  # noqa: S314 - written by coverage.py in this job
    except ET.ParseError:
        return
    changed = False
    for source in tree.getroot().iter("source"):
        text = (source.text or "").strip()
        if text and os.path.isabs(text):
            try:
                rel = os.path.relpath(text, root)
            except ValueError:
                continue
            if not rel.startswith(".."):
                source.text = rel
                changed = True
    if changed:
        atomic_write_bytes(
            path, ET.tostring(tree.getroot(), xml_declaration=True, encoding="utf-8")
        )


TORCH_RECORD = "/etc/dlci/torch.json"  # written by docker/Dockerfile: where torch came from


def image_torch(path: str = TORCH_RECORD) -> dict[str, Any] | None:
    """The image's record of its torch (version, CUDA, base or installed, file); None outside
    dl-ci's image. Read, not imported: importing torch takes seconds."""
    try:
        data = jsonio.decode(read_input(path, what="torch record", limit=1 << 16))
    except (DlciError, jsonio.DecodeError):
        return None
    return data if isinstance(data, dict) else None
