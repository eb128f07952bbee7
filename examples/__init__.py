"""Runnable examples (not part of the installed package)."""
