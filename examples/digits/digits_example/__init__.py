"""A small real deep-learning project for dl-ci: a CNN on scikit-learn's bundled digits."""
