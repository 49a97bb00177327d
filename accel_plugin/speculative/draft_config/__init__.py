"""The draft YAML (``ACCEL_DRAFT_CONFIG``): its schema, loading with file:line issues, path resolution and checks against the target."""
