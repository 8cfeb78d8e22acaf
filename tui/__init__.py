"""The live terminal UI (installed as `kvaudit.tui`): Textual screens over a backend.

May import: every analysis-side stage, Textual and Rich. Nothing outside it imports it
except `kvaudit.commands.tui`.
"""
