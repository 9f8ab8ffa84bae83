"""One module per ``dlci`` verb, each exposing ``main(argv) -> int``."""
