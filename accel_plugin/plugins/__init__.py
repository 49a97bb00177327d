"""The pluggy core: hook specifications, the plugin manager, the registries, the built-in plugin and backend selection."""
