"""Comparisons and their statistics, as typed results: report/ renders them.

Host-side: nothing here imports torch.
"""
