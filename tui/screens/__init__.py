"""The TUI's screens besides the main one: a finding's descriptors and the key help."""
