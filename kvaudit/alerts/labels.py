"""Prometheus' label names: what one may be, and the label that names an alert.

A module of its own, without the YAML parser the rule files need, so that the command
line checks `--group-by` without loading it.
"""

from __future__ import annotations

import re
from typing import Final

NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ALERTNAME: Final = "alertname"
