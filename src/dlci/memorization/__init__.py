"""The memorization test: the Target contract, batching, the engine, tracking, test helpers."""
