"""The TUI's panels: each renders one part of `Figures` and keeps no data of its own."""
