"""``dlci profile``: planned; not part of this release yet."""

from __future__ import annotations

from collections.abc import Sequence

from dlci.commands._planned import not_yet


def main(argv: Sequence[str]) -> int:
    return not_yet("profile", argv)
