"""Learned cost models: rank candidate programs of a task by predicted speed."""
