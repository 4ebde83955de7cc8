"""Helpers the site's page modules share."""

from __future__ import annotations

import re


def slug(text: str) -> str:
    """A file-name-safe form of a sweep or figure name (never empty)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "sweep"
