"""Reports: console output, GitHub outputs and annotations."""
