"""What the host trusts on a pull request: files read from the base commit, once."""
