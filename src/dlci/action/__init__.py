"""The action's host side (preflight, image, container, cleanup, summary) and the in-container job."""
