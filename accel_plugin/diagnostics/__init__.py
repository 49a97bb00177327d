"""Diagnostics: the kernel self-test and the compatibility matrix (cells, records, rendering)."""
