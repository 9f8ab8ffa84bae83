"""The in-container job (``dlci run``): its steps, its options, its files."""
