"""The action's rooms: the host side (preflight, image, container, cleanup, summary) and the job."""
