"""``dlci bisect``: the first commit that fails a gate, between a good and a bad one."""
