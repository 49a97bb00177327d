"""Diagnostics: the kernel self-test and the compatibility matrix (cells, records, the environment's row, the page)."""
