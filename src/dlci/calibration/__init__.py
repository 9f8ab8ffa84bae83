"""``dlci calibrate``: the ladder's numbers measured on the user's own model.

The method and how to read its files: docs/calibration.md.
"""
