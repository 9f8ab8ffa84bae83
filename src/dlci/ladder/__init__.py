"""The budget ladder: its format, YAML source, loading with extends, and tier selection."""
