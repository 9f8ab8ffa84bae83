"""The ``.dockerignore`` matcher: Docker's own rules, run in linear time."""
