"""dl-ci with Lightning: a LightningModule and a LightningDataModule on scikit-learn's digits."""
