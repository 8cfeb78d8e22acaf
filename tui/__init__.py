"""The live terminal UI (installed as `kvaudit.tui`)."""
