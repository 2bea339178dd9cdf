"""Datasets: the K&K puzzle generator and prompt loading."""
