"""dl-ci with Transformers: a tiny BERT-style classifier, built from a config, on synthetic text."""
