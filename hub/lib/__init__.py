"""Django-free helpers used by the hub (importable before settings are configured)."""
