"""Framework adapters (installed as ``accel_plugin.adapters``).

Each adapter imports its framework lazily, inside the adapter only.
"""
