"""Helpers for tests and demos: tiny local models (no downloads)."""
